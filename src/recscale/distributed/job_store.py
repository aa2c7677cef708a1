"""A job that spans hosts: the driver publishes it in the rendezvous store, the others receive it.

The driver (the host that runs ``kedro run --env=cluster``) holds the rendezvous store at
``train.launch.rdzv_endpoint`` for the whole job and writes the job's spec there before any agent
starts: the launch settings, the trainer's payload (configs, plan, data manifest) and the code
version. Every other host runs ``recscale join --endpoint host:port``, which reads the spec from
that store, refuses to run if its code differs from the driver's (naming both versions), and
starts its elastic agent with the driver's settings. Workers read their job from the store too,
so no host can train with a config of its own. The spec is signed with the job's secret
(``recscale.distributed.job_secret``) and verified by every host and worker before it acts on it;
the store listens on the endpoint's address only, not on every interface.

Every wait here has a deadline: a driver that does not answer, a spec that never appears.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import logging
import os
import socket
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from recscale.config import parse, to_dict
from recscale.distributed.config import LaunchConfig
from recscale.distributed.job_secret import SECRET_ENV, JobSecretError, sign, verify
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


POLL_S = 0.2  # how often a host that started before the driver looks for its store


def _wait_listening(host: str, port: int, timeout_s: float) -> float:
    """Wait until something accepts connections at ``host:port``, trying every ``POLL_S``;
    -> the seconds left of ``timeout_s``. TCPStore's own connect retries back off to about 10 s
    apart, so a host started before the driver would reach the store up to 10 s after it opened
    and miss a rendezvous' last call (the job would start without it)."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        try:
            with socket.create_connection((host, port), timeout=max(0.05, min(1.0, left))):
                return max(0.0, deadline - time.monotonic())
        except OSError as exc:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"nothing accepted connections at {host}:{port} within "
                                   f"{timeout_s:g} s (last: {exc})") from None
            time.sleep(min(POLL_S, left))


def _client(endpoint: str, timeout_s: float):
    """A client of the driver's store at ``endpoint``, once it listens (within ``timeout_s``)."""
    import torch.distributed as dist

    host, port = split_endpoint(endpoint)
    left = _wait_listening(host, port, timeout_s)
    return dist.TCPStore(host, port, is_master=False, wait_for_workers=False,
                         timeout=timedelta(seconds=max(1.0, left)))


def _serve_store(endpoint: str, timeout_s: float):
    """The rendezvous store served on the endpoint's own address (not every interface): a socket
    bound there, handed to the store (which owns it from then on)."""
    import torch.distributed as dist

    host, port = split_endpoint(endpoint)
    error: OSError | None = None
    found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    for family, kind, proto, _, addr in sorted(found, key=lambda a: a[0] != socket.AF_INET):
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(addr)
            sock.listen(1024)
        except OSError as exc:
            sock.close()
            error = exc
            continue
        store = dist.TCPStore(host, port, is_master=True, wait_for_workers=False,
                              timeout=timedelta(seconds=timeout_s), use_libuv=True,
                              master_listen_fd=sock.fileno())
        sock.detach()
        return store
    raise error or OSError(f"{host!r} resolves to no address")


class JobServer:
    """The driver's side: holds the rendezvous store at ``endpoint`` (the elastic agents of every
    host, this one's included, meet there) with the job's spec in it, signed with ``secret``,
    until closed."""

    def __init__(self, endpoint: str, spec: dict[str, Any], secret: str,
                 timeout_s: float = 60.0):
        try:
            self.store = _serve_store(endpoint, timeout_s)
        except Exception as exc:
            raise JobError(f"cannot serve the rendezvous at train.launch.rdzv_endpoint="
                           f"{endpoint!r} on this host ({type(exc).__name__}: {exc}): it must be "
                           "an address of this host and a free port") from exc
        self.endpoint = endpoint
        self.store.set(JOB_KEY, json.dumps(sign(spec, secret)))

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


def _published(endpoint: str, timeout_s: float) -> Any:
    """What the driver published at ``endpoint`` (a signed job), as it is: not verified."""
    try:
        raw = _client(endpoint, timeout_s).get(JOB_KEY)
    except Exception as exc:
        raise JobError(
            f"the driver at {endpoint} did not answer within {timeout_s:g} s "
            f"({type(exc).__name__}: {str(exc).splitlines()[0][:200]}): start the driver's "
            "command (kedro run --pipeline=dlrm --env=cluster) on that host, and check that this "
            "host can reach that address and port") from None
    try:
        return json.loads(raw)
    except ValueError:
        raise JobError(f"what the store at {endpoint} holds as the job is not JSON: refusing to "
                       "act on it") from None


def driver_answers(endpoint: str, timeout_s: float = 3.0) -> bool:
    """Whether the driver's store at ``endpoint`` answers (with a job in it)."""
    try:
        _published(endpoint, timeout_s)
    except JobError:
        return False
    return True


def fetch_job(endpoint: str, timeout_s: float, secret: str) -> dict[str, Any]:
    """The job spec the driver published at ``endpoint``, waiting up to ``timeout_s`` for the
    driver to answer and to publish it, once its signature holds for ``secret``. Raises
    :class:`JobError` if the driver does not answer, the spec's signature does not hold (another
    secret, or altered after signing) or the driver runs other code than this host."""
    try:
        spec = verify(_published(endpoint, timeout_s), secret, endpoint)
    except JobSecretError as exc:
        raise JobError(str(exc)) from None
    mine, theirs = code_version(), spec.get("code_version")
    if theirs != mine:
        raise JobError(f"this host runs recscale {mine} but the driver at {endpoint} runs "
                       f"recscale {theirs}: install the same code on every host")
    return spec


def launch_config_of(spec: dict[str, Any]) -> LaunchConfig:
    return parse(LaunchConfig, spec["launch"], "train.launch")


@contextlib.contextmanager
def secret_for_workers(secret: str):
    """``RECSCALE_JOB_SECRET`` set for the workers a launch starts (they see the environment of
    the launch), and as it was afterwards."""
    before = os.environ.get(SECRET_ENV)
    os.environ[SECRET_ENV] = secret
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(SECRET_ENV, None)
        else:
            os.environ[SECRET_ENV] = before


def serve_and_launch(fn: Callable[[str], Any], spec: dict[str, Any], secret: str,
                     world_size_of: Callable[[dict[int, Any]], int]) -> dict[int, Any]:
    """The driver: publish ``spec`` signed with ``secret`` at its rendezvous endpoint and run
    this host's workers, each calling ``fn(endpoint)`` (``fn`` reads the job with
    :func:`fetch_job`); then serve until the other hosts of the last round
    (``world_size_of(results)`` ranks in all) left."""
    from recscale.distributed.launch import launch

    cfg = launch_config_of(spec)
    with JobServer(cfg.rdzv_endpoint, spec, secret, cfg.rdzv_timeout_s) as server, \
            secret_for_workers(secret):
        log.info("serving job %s at %s: waiting for %s host(s) to join (recscale join "
                 "--endpoint %s)", spec["run_id"], cfg.rdzv_endpoint, cfg.nnodes,
                 cfg.rdzv_endpoint)
        results = launch(fn, (cfg.rdzv_endpoint,), cfg, run_id=spec["run_id"],
                         external_store=True)
        server.wait_for_leavers(world_size_of(results) // cfg.nproc_per_node - 1,
                                timeout_s=3 * cfg.heartbeat_s + 10)
        return results


def join(fn: Callable[[str], Any], endpoint: str, timeout_s: float, secret: str,
         check: Callable[[dict[str, Any]], None] | None = None) -> dict[int, Any]:
    """Another host: receive the job from the driver at ``endpoint``, verified with ``secret``,
    and run this host's workers with the driver's launch settings, each calling
    ``fn(endpoint)``. ``check(spec)`` runs first: a host that cannot take part (or a job it
    must not act on) fails before it joins the rendezvous, having written nothing."""
    from recscale.distributed.launch import launch

    spec = fetch_job(endpoint, timeout_s, secret)
    if check is not None:
        check(spec)
    # the driver's settings, but this host's way to the rendezvous and its own address
    cfg = dataclasses.replace(launch_config_of(spec), rdzv_endpoint=endpoint, local_addr=None)
    log.info("joined job %s of the driver at %s: %d worker(s) on this host, %s host(s)",
             spec["run_id"], endpoint, cfg.nproc_per_node, cfg.nnodes)
    try:
        with secret_for_workers(secret):
            return launch(fn, (endpoint,), cfg, run_id=spec["run_id"], external_store=True)
    finally:
        try:  # the driver serves the rendezvous until this host's agent closed it
            _client(endpoint, 5.0).add(LEFT_KEY, 1)
        except Exception:  # noqa: BLE001 - the driver is gone: nothing to tell
            pass
