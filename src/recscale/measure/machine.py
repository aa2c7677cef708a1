"""Measure this machine as training lays it out, and fit the cost model's constants: a topology
the planner accepts (``sharding.topology: <file>``). ``calibrate`` runs every point on the
topology's ``local_world_size`` ranks (started by ``recscale.distributed.launch``; one rank runs
in this process), each with its share of the cores, measuring the same point at the same time (a
rank shares the machine with its peers, as in a step); a point's time is the median of ``reps``
timed repetitions after a warm-up, on the slowest rank, and the median over ``rounds`` sweeps
(more until ``min_seconds``). ``fit_calibration`` fits the points (``recscale.sharding.cost_fit``,
on the cost model's own byte formula):

- lookup + fused update per tier (``lookups``): in memory (the compute tier), DDR- and SSD-backed
  cache, by embedding dim, pooling and id skew, at two batch sizes -> seconds per step
  (``<tier>_op_s``), per id (``<tier>_id_s``), per distinct row updated (``<tier>_row_s``), per
  pooled vector (``bag_s``) and per byte the cost model counts (``<tier>_bw``). On a CPU the
  compute tier is DDR, so the DDR-backed cache has no tier of the topology to go to: it is
  reported (``fits["ddr_cache"]``), not written.
- the output's assembly (``lookups.measure_assembly``) -> ``assemble_s`` per output element.
- with 2 or more ranks a host (``comms``): gloo all-to-all and all-reduce (reported:
  ``fits["intra_host"]``) and the runtime's own exchange, whose communication as ``CommStats``
  counts it gives ``intra_node_lat_s`` / ``intra_node_bw`` and whose work beyond the lookups
  gives ``exchange_op_s`` / ``exchange_bw``; the runtime's training steps on the host's ranks
  (``steps.measure_host_steps``) then correct ``exchange_bw`` where the step overlaps it.
- the dense arch (``dense``) at each dim and three batch sizes -> ``dense_flops``,
  ``dense_op_s`` and ``interaction_s`` (per element of the interaction).

Across hosts, ``link.measure_link`` (one process per host, ``recscale calibrate
--link-endpoint``) gives ``inter_node_*``. "Calibration" here is the cost model's; the click
probabilities' calibration is ``recscale.evaluate``'s.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from recscale.distributed import (
    LaunchConfig,
    launch,
    run_in_group,
    set_threads,
    threads_for_run,
    worker_entry,
)
from recscale.measure.comms import measure_comms, measure_exchange
from recscale.measure.config import (
    CalibrationConfig,
    CalibrationError,
    Sweeps,
    memory_tables,
    preset_shape,
)
from recscale.measure.dense import measure_dense
from recscale.measure.lookups import measure_assembly, measure_module
from recscale.measure.steps import measure_host_steps, predict_host_steps
from recscale.measure.timing import check_writable, median_of_rounds
from recscale.model import ModelConfig
from recscale.sharding import Topology
from recscale.sharding import cost_fit as fits
from recscale.sharding.types import OPTIMIZER_STATE, PRECISION_BYTES


@dataclass
class Calibration:
    """The measured topology and what it came from (``points``: every timing; ``fits``: the
    fitted constants per part, with the fit's median relative error)."""

    topology: Topology
    fits: dict[str, dict[str, float]] = field(default_factory=dict)
    points: dict[str, list[dict[str, float]]] = field(default_factory=dict)
    seconds: float = 0.0
    sweeps: int = 0  # sweeps over every point (each point: the median over them)

    def metrics(self) -> dict[str, float]:
        out = {f"calibration.{part}.{k}": v for part, f in self.fits.items() for k, v in f.items()}
        out["calibration.seconds"] = self.seconds
        out["calibration.sweeps"] = float(self.sweeps)
        return out


# --- one rank's measurements -------------------------------------------------------------------------
def _measure_all(cfg: CalibrationConfig, model_cfg: ModelConfig, num_tables: int, store: str,
                 progress=None, sync=None, world: int = 1, sweep: int = 0,
                 rounds: int = 1) -> dict[str, list[dict]]:
    """Every point of the calibration, in this process (one rank of the layout); ``sync``
    before each point keeps the ranks of a host measuring at the same time; ``sweep``: which of
    the ``rounds`` sweeps expected this is (for the progress bar)."""
    from recscale.embedding.cache import TieredEmbeddingBags
    from recscale.embedding.tbe import FusedEmbeddingBags
    from recscale.embedding.tier_config import TierConfig

    per_module = len(cfg.dims) * len(cfg.poolings) * len(cfg.batch_sizes) * len(cfg.skews)
    total = (per_module * len(cfg.tiers) + len(cfg.dims)
             * len({*cfg.batch_sizes, (min(cfg.batch_sizes) + max(cfg.batch_sizes)) // 2})
             + len(cfg.dims) * len(cfg.batch_sizes))
    done = [sweep * total]

    def tick():
        done[0] += 1
        if progress is not None:
            progress.update(done[0], total * rounds)
        if sync is not None:
            sync()

    pts = {"memory": measure_module(
        lambda o, rows, d: FusedEmbeddingBags(rows, [d] * len(rows), o), cfg,
        memory_tables(cfg, world), tick)}
    for tier in ("ddr", "ssd"):
        if tier not in cfg.tiers:
            continue
        tcfg = TierConfig(tier=tier, scratch_dir=store, min_cache_rows=64, prefetch=False)

        def make(o, rows, d, tcfg=tcfg):
            return TieredEmbeddingBags(rows, [d] * len(rows), o, config=tcfg,
                                       cache_fractions=[cfg.cache_fraction] * len(rows))

        rows = max(cfg.cache_rows, int(2 * max(cfg.batch_sizes) * max(cfg.poolings)
                                       / cfg.cache_fraction))
        pts[f"{tier}_cache"] = measure_module(make, cfg, [rows], tick)
    pts["dense"] = measure_dense(model_cfg, num_tables, cfg, tick)
    pts["assembly"] = measure_assembly(cfg, num_tables, world, tick)
    return pts


def _calibration_rank(ctx, cfg_d, model_d, num_tables, store, mode):
    import torch.distributed as dist

    from recscale.config import parse
    from recscale.progress import Progress

    cfg = parse(CalibrationConfig, cfg_d, "calibration")
    model_cfg = parse(ModelConfig, model_d, "model")
    if ctx.rank == 0 and mode in ("log", "auto"):
        # a forked worker's logging is not the caller's: rank 0's progress lines go to stderr
        if not logging.getLogger().handlers:
            logging.basicConfig(format="%(asctime)s %(name)s: %(message)s")
        logging.getLogger("recscale.progress").setLevel(logging.INFO)
    set_threads(cfg.num_threads, ctx.local_world_size)
    sweeps = []
    with Progress(None, "calibrate", unit="point", mode=mode if ctx.rank == 0 else "off",
                  log_every_s=3.0) as bar:
        count = Sweeps(cfg)
        while True:
            go = torch.tensor([int(count.more()), count.expected])  # rank 0's clock decides
            dist.broadcast(go, 0)
            if not go[0]:
                break
            pts = _measure_all(cfg, model_cfg, num_tables, os.path.join(store, f"rank{ctx.rank}"),
                               bar, sync=dist.barrier, world=ctx.world_size, sweep=count.done,
                               rounds=int(go[1]))
            if cfg.comms:
                pts["intra_host"] = measure_comms(cfg.comm_sizes, max(3 * cfg.reps, 7))
                pts["exchange"] = measure_exchange(ctx, cfg, num_tables)
            sweeps.append(pts)
            count.finished_one()
    pts = median_of_rounds(sweeps)
    if cfg.comms:  # the runtime's steps over the exchange, against which its work is fitted
        if ctx.rank == 0 and mode != "off":  # the progress bar's logger, as its lines
            logging.getLogger("recscale.progress").info(
                "calibrate: the training step on this host's %d ranks, dims %s, %d round(s)",
                ctx.world_size, ",".join(map(str, cfg.dims)), cfg.rounds)
        pts["host_steps"] = measure_host_steps(ctx, cfg, model_cfg, num_tables)
    return pts, count.done


@worker_entry
def _calibration_worker(launch_d: dict, *args):
    from recscale.config import parse

    return run_in_group(parse(LaunchConfig, launch_d, "calibration.launch"), _calibration_rank,
                        *args)


def _merge(per_rank: list[dict[str, list[dict]]]) -> dict[str, list[dict]]:
    """The ranks measured the same points at the same time: each point's slowest rank."""
    out = {}
    for part, pts in per_rank[0].items():
        out[part] = [{**p, "seconds": max(r[part][i]["seconds"] for r in per_rank)}
                     for i, p in enumerate(pts)]
    return out


# --- the whole calibration --------------------------------------------------------------------------
def calibrate(base: Topology, cfg: CalibrationConfig | None = None,
              model_cfg: ModelConfig | None = None, num_tables: int | None = None,
              weight_precision: str = "fp32", progress_mode: str = "auto") -> Calibration:
    """Measure this machine laid out as ``base`` says (``local_world_size`` ranks measuring at
    the same time, each with its share of the cores, as training runs them) and return ``base``
    with its constants replaced by the measured ones (see the module docstring). Raises
    ``CalibrationError`` where a part cannot run (a tier's directory not writable, a GPU
    topology)."""
    from recscale.config import to_dict
    from recscale.progress import Progress

    cfg = cfg or CalibrationConfig()
    model_cfg = model_cfg or ModelConfig()
    num_tables = preset_shape()[1] if num_tables is None else num_tables
    if base.device != "cpu":
        raise CalibrationError(f"calibration measures CPU ranks here; topology {base.name!r} is "
                               f"for device {base.device!r}: calibrate on its own machines")
    if weight_precision != "fp32":
        raise CalibrationError(f"weights {weight_precision}: the CPU runtime trains fp32 tables")
    scratch = cfg.scratch_dir or tempfile.gettempdir()
    if "ssd" in cfg.tiers:
        check_writable(scratch, "SSD-backed cache tier")
    t_start = time.perf_counter()
    lws = base.local_world_size
    store = tempfile.mkdtemp(prefix="recscale-calibrate-", dir=scratch if "ssd" in cfg.tiers
                             else None)
    try:
        if lws == 1:  # in this process: its threads and memory are its own again afterwards
            with threads_for_run(cfg.num_threads, 1), Progress(
                    None, "calibrate", unit="point", mode=progress_mode, log_every_s=3.0) as bar:
                count, sweeps = Sweeps(cfg), []
                while count.more():
                    sweeps.append(_measure_all(replace(cfg, comms=False), model_cfg, num_tables,
                                               store, bar, sweep=count.done,
                                               rounds=count.expected))
                    count.finished_one()
                pts, n_sweeps = median_of_rounds(sweeps), count.done
        else:
            lc = LaunchConfig(world_size=lws, collective_timeout_s=cfg.timeout_s,
                              exit_timeout_s=min(cfg.timeout_s, 60.0))
            res = launch(_calibration_worker, (to_dict(lc), to_dict(cfg), to_dict(model_cfg),
                                               num_tables, store, progress_mode), lc)
            pts = _merge([res[r][0] for r in sorted(res)])
            n_sweeps = res[0][1]
    finally:
        shutil.rmtree(store, ignore_errors=True)
    out = fit_calibration(base, pts, cfg, num_tables, weight_precision)
    out.seconds, out.sweeps = time.perf_counter() - t_start, n_sweeps
    return out


def fit_calibration(base: Topology, pts: dict[str, list[dict]],
                    cfg: CalibrationConfig | None = None, num_tables: int | None = None,
                    weight_precision: str = "fp32") -> Calibration:
    """``base`` with its constants fitted to measured ``pts`` (a calibration's ``points``, or
    ``median_of_rounds`` of several calibrations' points taken at different times: the same
    ``cfg``, ``num_tables`` and layout)."""
    cfg = cfg or CalibrationConfig()
    num_tables = preset_shape()[1] if num_tables is None else num_tables
    scratch = cfg.scratch_dir or tempfile.gettempdir()
    lws = base.local_world_size
    orow, oelem = (4.0 * x for x in OPTIMIZER_STATE[cfg.optimizer])
    wb = float(PRECISION_BYTES[weight_precision])
    out = Calibration(base, points=pts)
    fast = out.fits["memory"] = fits.fit_memory(pts["memory"], wb, orow, oelem)
    for tier in ("ddr", "ssd"):
        if f"{tier}_cache" in pts:
            out.fits[f"{tier}_cache"] = fits.fit_cached(pts[f"{tier}_cache"], fast, wb, orow, oelem)
    out.fits["dense"] = fits.fit_dense(pts["dense"])
    out.fits["assembly"] = fits.fit_assembly(pts["assembly"])
    if "intra_host" in pts:
        out.fits["intra_host"] = fits.fit_comms(pts["intra_host"], lws)
        out.fits["exchange"] = fits.fit_exchange(pts["exchange"], fast, wb, orow, oelem,
                                             max(num_tables, 2), out.fits["assembly"]["s"])
    ct = base.compute_tier
    kw: dict[str, Any] = {f"{ct}_bw": fast["bw"], f"{ct}_op_s": fast["op_s"],
                          f"{ct}_id_s": fast["id_s"], f"{ct}_row_s": fast["row_s"],
                          "bag_s": fast["bag_s"],
                          "dense_flops": out.fits["dense"]["flops"],
                          "dense_op_s": out.fits["dense"]["op_s"],
                          "interaction_s": out.fits["dense"]["interaction_s"],
                          "assemble_s": out.fits["assembly"]["s"]}
    for tier in ("hbm", "ddr", "ssd"):
        fit = out.fits.get(f"{tier}_cache")
        if fit is not None and tier != ct:
            kw.update({f"{tier}_bw": fit["bw"], f"{tier}_op_s": fit["op_s"],
                       f"{tier}_id_s": fit["id_s"], f"{tier}_row_s": fit["row_s"]})
            if base.capacity(tier) <= 0 and tier == "ssd":  # a tier the run may spill to
                kw["ssd_bytes"] = float(shutil.disk_usage(scratch).free / lws)
    if "exchange" in out.fits:  # the runtime's own exchange, not the bare collectives
        x = out.fits["exchange"]
        kw.update(intra_node_bw=x["bw"], intra_node_lat_s=x["lat_s"], exchange_op_s=x["op_s"],
                  exchange_bw=x["cpu_bw"], codec_s=x["codec_s"])
        if pts.get("host_steps"):  # the exchange's work as the training steps show it
            steps = predict_host_steps(pts["host_steps"], replace(base, **kw))
            f = out.fits["host_steps"] = fits.fit_exchange_work(steps)
            kw["exchange_bw"] = x["cpu_bw"] * f["factor"]
    kw["name"] = base.name if base.name.endswith("-calibrated") else f"{base.name}-calibrated"
    out.topology = replace(base, **kw)
    return out
