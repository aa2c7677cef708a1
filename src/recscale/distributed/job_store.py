"""A job that spans hosts: the driver publishes it in the rendezvous store, the others receive it.

The driver (the host that runs ``kedro run --env=cluster``) holds the rendezvous store at
``train.launch.rdzv_endpoint`` for the whole job and writes the job's spec there before any agent
starts: the launch settings, the trainer's payload (configs, plan, data manifest) and the code
version. Every other host runs ``recscale join --endpoint host:port``, which reads the spec from
that store, refuses to run if its code differs from the driver's (naming both versions), and
starts its elastic agent with the driver's settings. Workers read their job from the store too,
so no host can train with a config of its own.

Every wait here has a deadline: a driver that does not answer, a spec that never appears.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from recscale.config import parse, to_dict
from recscale.distributed.config import LaunchConfig
from recscale.distributed.netaddr import split_endpoint

log = logging.getLogger(__name__)

JOB_KEY = "recscale/job"
LEFT_KEY = "recscale/hosts_left"  # hosts other than the driver's that finished


class JobError(RuntimeError):
    """The job cannot be received or run on this host; the message says why and what to do."""


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """``<package version>+<12 hex digits of a hash of every .py file of the package>``: two
    hosts with the same string run the same code."""
    import importlib.metadata

    root = Path(__file__).resolve().parents[1]  # the recscale package
    try:
        version = importlib.metadata.version("recscale")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    h = hashlib.sha256()
    for f in sorted(root.rglob("*.py")):
        h.update(str(f.relative_to(root)).encode())
        h.update(f.read_bytes())
    return f"{version}+{h.hexdigest()[:12]}"


def _store(endpoint: str, timeout_s: float, is_master: bool):
    import torch.distributed as dist

    host, port = split_endpoint(endpoint)
    return dist.TCPStore(host, port, is_master=is_master, wait_for_workers=False,
                         timeout=timedelta(seconds=timeout_s))


class JobServer:
    """The driver's side: holds the rendezvous store at ``endpoint`` (the elastic agents of every
    host, this one's included, meet there) with the job's spec in it, until closed."""

    def __init__(self, endpoint: str, spec: dict[str, Any], timeout_s: float = 60.0):
        try:
            self.store = _store(endpoint, timeout_s, is_master=True)
        except Exception as exc:
            raise JobError(f"cannot serve the rendezvous at train.launch.rdzv_endpoint="
                           f"{endpoint!r} on this host ({type(exc).__name__}: {exc}): it must be "
                           "an address of this host and a free port") from exc
        self.endpoint = endpoint
        self.store.set(JOB_KEY, json.dumps(spec))

    def wait_for_leavers(self, hosts: int, timeout_s: float) -> int:
        """Keep serving until ``hosts`` other hosts said they left (their agents close the
        rendezvous through this store), or ``timeout_s``; -> how many did."""
        deadline = time.monotonic() + timeout_s
        left = int(self.store.add(LEFT_KEY, 0))
        while left < hosts and time.monotonic() < deadline:
            time.sleep(0.1)
            left = int(self.store.add(LEFT_KEY, 0))
        if left < hosts:
            log.warning("%d of %d other host(s) did not say they left within %g s", hosts - left,
                        hosts, timeout_s)
        return left

    def close(self) -> None:
        self.store = None  # the server stops with its last reference

    def __enter__(self) -> JobServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def make_spec(cfg: LaunchConfig, run_id: str, payload: dict[str, Any]) -> dict[str, Any]:
    return {"code_version": code_version(), "run_id": run_id, "launch": to_dict(cfg),
            "payload": payload}


def fetch_job(endpoint: str, timeout_s: float) -> dict[str, Any]:
    """The job spec the driver published at ``endpoint``, waiting up to ``timeout_s`` for the
    driver to answer and to publish it. Raises :class:`JobError` if it does not, or if the
    driver runs other code than this host."""
    try:
        store = _store(endpoint, timeout_s, is_master=False)
        spec = json.loads(store.get(JOB_KEY))
    except Exception as exc:
        raise JobError(
            f"the driver at {endpoint} did not answer within {timeout_s:g} s "
            f"({type(exc).__name__}: {str(exc).splitlines()[0][:200]}): start the driver's "
            "command (kedro run --pipeline=dlrm --env=cluster) on that host, and check that this "
            "host can reach that address and port") from None
    mine, theirs = code_version(), spec.get("code_version")
    if theirs != mine:
        raise JobError(f"this host runs recscale {mine} but the driver at {endpoint} runs "
                       f"recscale {theirs}: install the same code on every host")
    return spec


def launch_config_of(spec: dict[str, Any]) -> LaunchConfig:
    return parse(LaunchConfig, spec["launch"], "train.launch")


def serve_and_launch(fn: Callable[[str], Any], spec: dict[str, Any],
                     world_size_of: Callable[[dict[int, Any]], int]) -> dict[int, Any]:
    """The driver: publish ``spec`` at its rendezvous endpoint and run this host's workers,
    each calling ``fn(endpoint)`` (``fn`` reads the job with :func:`fetch_job`); then serve
    until the other hosts of the last round (``world_size_of(results)`` ranks in all) left."""
    from recscale.distributed.launch import launch

    cfg = launch_config_of(spec)
    with JobServer(cfg.rdzv_endpoint, spec, cfg.rdzv_timeout_s) as server:
        log.info("serving job %s at %s: waiting for %s host(s) to join (recscale join "
                 "--endpoint %s)", spec["run_id"], cfg.rdzv_endpoint, cfg.nnodes,
                 cfg.rdzv_endpoint)
        results = launch(fn, (cfg.rdzv_endpoint,), cfg, run_id=spec["run_id"],
                         external_store=True)
        server.wait_for_leavers(world_size_of(results) // cfg.nproc_per_node - 1,
                                timeout_s=3 * cfg.heartbeat_s + 10)
        return results


def join(fn: Callable[[str], Any], endpoint: str, timeout_s: float,
         check: Callable[[dict[str, Any]], None] | None = None) -> dict[int, Any]:
    """Another host: receive the job from the driver at ``endpoint`` and run this host's
    workers with the driver's launch settings, each calling ``fn(endpoint)``. ``check(spec)``
    runs first: a host that cannot take part fails before it joins the rendezvous."""
    from recscale.distributed.launch import launch

    spec = fetch_job(endpoint, timeout_s)
    if check is not None:
        check(spec)
    # the driver's settings, but this host's way to the rendezvous and its own address
    cfg = dataclasses.replace(launch_config_of(spec), rdzv_endpoint=endpoint, local_addr=None)
    log.info("joined job %s of the driver at %s: %d worker(s) on this host, %s host(s)",
             spec["run_id"], endpoint, cfg.nproc_per_node, cfg.nnodes)
    try:
        return launch(fn, (endpoint,), cfg, run_id=spec["run_id"], external_store=True)
    finally:
        try:  # the driver serves the rendezvous until this host's agent closed it
            _store(endpoint, 5.0, is_master=False).add(LEFT_KEY, 1)
        except Exception:  # noqa: BLE001 - the driver is gone: nothing to tell
            pass
