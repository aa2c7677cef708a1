"""The link between hosts (``recscale calibrate --link-endpoint``, one process per host): latency,
rate and a rate limiter's burst per call from the runtime's own exchange across it, and, with a
calibrated host to compare with, the link's rate and CPU cost fitted on training steps run across
it (``steps.measure_link_steps``)."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

import torch

from recscale.distributed import threads_for_run
from recscale.measure.comms import measure_comms, measure_exchange
from recscale.measure.config import CalibrationConfig, CalibrationError, preset_shape
from recscale.measure.timing import median_of_rounds
from recscale.model import ModelConfig
from recscale.sharding import Topology
from recscale.sharding import cost_fit as fits

LINK_SIZES = (1 << 16, 1 << 19, 1 << 21, 1 << 23)  # bytes per all-to-all across hosts
# the exchange across hosts pauses this long before each step's forward and backward, as a
# training step computes between them: a rate limiter's token bucket refills meanwhile
LINK_GAP_S = 0.02


def measure_link(rank: int, world_size: int, endpoint: str, cfg: CalibrationConfig | None = None,
                 timeout_s: float = 60.0, base: Topology | None = None,
                 tables: int | None = None, model_cfg: ModelConfig | None = None) -> dict[str, Any]:
    """The link between hosts: one process per host (``rank`` of ``world_size``; rank 0 serves
    the store at ``endpoint`` = "addr:port", an address the others reach), gloo all-to-alls of
    ``LINK_SIZES`` bytes (reported: ``collectives``) and the runtime's exchange across the link
    (``comms.measure_exchange`` in ``cfg.rounds`` sweeps, each point their median; pausing
    ``LINK_GAP_S`` before its forward and its backward, where a step computes), whose
    communication as ``CommStats`` counts it is fitted to latency per call + the bytes each call
    sends beyond a burst (``fits.fit_link``: a token bucket's allowance, 0 on a link without
    one): ``{"inter_node_lat_s", "inter_node_bw", "inter_node_burst_bytes", "fit",
    "collectives", "points", "exchange", "inter_node_cpu_s", "inter_node_cpu_bw", "cpu_fit",
    "steps", "rate_fit", "exchange_bw"}``; with ``base`` (one host's calibrated topology,
    ``exchange_bw`` measured) the training step itself run across the link
    (``steps.measure_link_steps``, ``model_cfg``'s dense arch, default ``ModelConfig()``) sets the
    link's rate (``inter_node_bw``: the exchange's rate, ``exchange_bw``, x the factor at which
    the steps' communication is predicted, ``fits.fit_link_rate``) and its extra work on the
    ranks' own cores a step and per byte sent across (``fits.fit_link_steps``; else both 0,
    and the rate the exchange's). A peer missing for
    ``timeout_s`` ends it with an error naming the endpoint."""
    from datetime import timedelta


    cfg = cfg or CalibrationConfig()
    tables = preset_shape()[1] if tables is None else tables
    host, _, port = endpoint.rpartition(":")
    if not host or not port.isdigit():
        raise CalibrationError(f"link endpoint {endpoint!r}: expected host:port")
    if not 0 <= rank < world_size or world_size < 2:
        raise CalibrationError(f"link rank {rank} of {world_size}: expected 0 <= rank < world "
                               "and a world of 2 hosts or more")
    timeout = timedelta(seconds=timeout_s)
    # gloo listens on the interface that routes to host 0 (in a namespace or on a host with
    # several interfaces the host name may resolve to an address the peers cannot reach)
    from recscale.distributed.netaddr import interface_of, route_addr

    try:
        ifname = interface_of(route_addr(endpoint))
    except OSError as e:
        raise CalibrationError(f"link calibration: no route to {endpoint} ({e})") from e
    set_env = bool(ifname) and "GLOO_SOCKET_IFNAME" not in os.environ
    if set_env:  # for this measurement only (the caller's process goes on without it)
        os.environ["GLOO_SOCKET_IFNAME"] = ifname
    try:  # in the caller's process: its threads and memory are its own again afterwards
        with threads_for_run(cfg.num_threads or 1, 1):
            got = _link(rank, world_size, host, int(port), endpoint, cfg, timeout, timeout_s,
                        tables, base, model_cfg or ModelConfig())
    finally:
        if set_env:
            os.environ.pop("GLOO_SOCKET_IFNAME", None)
    got["inter_node_cpu_bw"], got["inter_node_cpu_s"], got["cpu_fit"] = 0.0, 0.0, None
    got["rate_fit"], got["exchange_bw"] = None, got["inter_node_bw"]
    if got["steps"]:  # a calibrated host to compare with
        # the link's rate as the training steps' own communication shows it, then its CPU cost
        # against the step predicted at that rate
        got["rate_fit"] = rate = fits.fit_link_rate(got["steps"])
        got["inter_node_bw"] *= rate["factor"]
        got["steps"] = [{**p, "predicted": p["predicted_by_rate"][rate["index"]],
                         "predicted_comm": p["comm_by_rate"][rate["index"]]}
                        for p in got["steps"]]
        got["cpu_fit"] = fits.fit_link_steps(got["steps"])
        got["inter_node_cpu_bw"] = got["cpu_fit"]["cpu_bw"]
        got["inter_node_cpu_s"] = got["cpu_fit"]["cpu_s"]
    return got


def _link(rank, world_size, host, port, endpoint, cfg, timeout, timeout_s, tables, base,
          model_cfg) -> dict[str, Any]:
    import torch.distributed as dist

    try:
        store = dist.TCPStore(host, port, world_size, is_master=rank == 0, timeout=timeout,
                              wait_for_workers=True)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size,
                                timeout=timeout)
    except (RuntimeError, dist.DistStoreError) as e:
        raise CalibrationError(f"link calibration: the {world_size} hosts did not all reach "
                               f"{endpoint} within {timeout_s:.0f} s ({e})") from e
    try:
        # the exchange's collective, up to the sizes a step sends (a shaped link's burst
        # allowance flatters small messages only)
        pts = measure_comms(LINK_SIZES, max(3 * cfg.reps, 7), ("all_to_all",))
        # and the runtime's own exchange across the link: its communication as CommStats
        # counts it is what a run's comm time is made of (a shaped link's TCP under the
        # exchange's pattern is slower than under a lone all-to-all)
        from types import SimpleNamespace

        ctx = SimpleNamespace(rank=rank, world_size=world_size,
                              sparse_group=dist.new_group(backend="gloo", timeout=timeout))
        # dims 4 and 8 too: calls small enough to pass within a rate limiter's burst pin the
        # latency per call apart from the burst. In cfg.rounds sweeps, each point the median
        # over them, as the host's points are (one sweep's fit of the link's CPU cost moved
        # 1.0-2.8 GB/s between benchmark runs minutes apart)
        xpts = median_of_rounds([
            {"exchange": measure_exchange(ctx, cfg, tables, gap_s=LINK_GAP_S,
                                           extra_dims=(4, 8))}
            for _ in range(cfg.rounds)])["exchange"]
        xfit = fits.fit_link(xpts)
        # the training step across the link, against the host's prediction of it with the
        # link as host 0 measured it: what the link costs the ranks' own cores. Host 0's base
        # and model (the others need neither) decide, for every host
        decided = [None, model_cfg]  # [the topology to predict on, the dense arch]
        if rank == 0 and base is not None and base.exchange_bw > 0:
            decided[0] = replace(base.for_world(world_size, 1), inter_node_lat_s=xfit["lat_s"],
                                 inter_node_bw=xfit["bw"],
                                 inter_node_burst_bytes=xfit["burst_bytes"])
        dist.broadcast_object_list(decided, src=0)
        steps = []
        if decided[0] is not None:
            from recscale.distributed import WorkerContext
            from recscale.measure.steps import measure_link_steps

            wctx = WorkerContext(rank, world_size, 0, 1, torch.device("cpu"), "gloo",
                                 ctx.sparse_group, timeout_s)
            steps = measure_link_steps(wctx, cfg, decided[1], tables, decided[0])
    finally:
        dist.destroy_process_group()
    fit = fits.fit_comms(pts, world_size)
    return {"inter_node_lat_s": xfit["lat_s"], "inter_node_bw": xfit["bw"],
            "inter_node_burst_bytes": xfit["burst_bytes"], "fit": xfit,
            "collectives": fit, "points": pts, "exchange": xpts, "steps": steps}
