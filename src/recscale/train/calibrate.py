"""Calibration: measure what the cost model's constants stand for, on this machine, and write a
topology the planner accepts (``sharding.topology: <file>``). Its configuration and timing
helpers are in ``calibration_config``, the collectives (and the link between hosts) in
``calibration_comms``, the fits in ``calibration_fits``.

It lives in ``train`` because it runs the runtime's own pieces (fbgemm table-batched embeddings,
the tiered cache, gloo collectives started by ``recscale.distributed.launch``, the dense arch),
which the torch-free planner (``recscale.sharding``) may not import.

What is measured runs on the workers as training lays them out: the topology's
``local_world_size`` ranks (started by ``recscale.distributed.launch``; one rank runs in this
process), each with its share of the cores, measuring the same point at the same time (a rank
shares the machine with its peers, as in a step); a point's time is the median of ``reps`` timed
repetitions after a warm-up, on the slowest rank:

- lookup + fused update (forward, backward with the fused optimizer), per tier: in memory
  (``FusedEmbeddingBags``: the compute tier), DDR-backed and SSD-backed cache
  (``TieredEmbeddingBags``, uniform ids so most lookups miss; the measured hit rate separates
  the slow tier's share), by embedding dim and pooling factor, at two batch sizes. Fitted (non-
  negative least squares) to the cost model's terms: seconds per step (``<tier>_op_s``), per id
  (``<tier>_id_s``), per pooled vector (``bag_s``) and per byte the cost model counts
  (``<tier>_bw``). On a CPU the compute tier is DDR, so the DDR-backed cache has no tier of the
  topology to go to: it is reported (``fits["ddr_cache"]``), not written.
- pooled all-to-all and all-reduce inside a host: the host's gloo ranks, messages of several sizes,
  fitted to latency per call + bytes each rank sends (reported: ``fits["intra_host"]``); and the
  runtime's own exchange (``ShardedEmbeddingCollection``, table-wise shards, forward + backward):
  its communication as ``CommStats`` counts it (what a run reports) gives ``intra_node_lat_s`` and
  ``intra_node_bw``, the rest of its step beyond the lookups gives ``exchange_op_s`` and
  ``exchange_bw`` (the exchange's work on the rank's cores), which the runtime's own training
  steps on the host's ranks then correct (``calibration_steps.measure_host_steps``: what the
  exchange costs where the step overlaps it). Across hosts: ``measure_link``, one
  process per host (``recscale calibrate --link-endpoint``), gives ``inter_node_lat_s`` and
  ``inter_node_bw``.
- the dense arch (bottom MLP, interaction, top MLP) forward + backward + optimizer step of the
  model at each embedding dim and three batch sizes: ``dense_flops`` (the MLPs), ``dense_op_s``
  and ``interaction_s`` (per element of the interaction: its small batched products and copies
  run far below the MLPs' FLOP rate).
"""

from __future__ import annotations

import itertools
import logging
import os
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass, field, replace
from typing import Any

import torch

import recscale.train.calibration_fits as fits
from recscale.data.batch import SparseFeatures
from recscale.distributed import (
    LaunchConfig,
    launch,
    run_in_group,
    set_threads,
    threads_for_run,
    worker_entry,
)
from recscale.model.dlrm import DenseArch, ModelConfig, interaction_dim
from recscale.sharding import Topology
from recscale.sharding.step_time import DenseSpec
from recscale.sharding.types import OPTIMIZER_STATE
from recscale.train.calibration_comms import (  # noqa: F401  (measure_link: the API)
    LINK_SIZES,
    _measure_comms,
    _measure_exchange,
    measure_link,
)
from recscale.train.calibration_config import (  # noqa: F401  (re-exported: the API)
    CalibrationConfig,
    CalibrationError,
    Sweeps,
    check_writable,
    median_of_rounds,
    memory_tables,
)
from recscale.train.calibration_config import median_time as _median_time
from recscale.train.calibration_steps import measure_host_steps, predict_host_steps

NUM_DENSE = 13


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


# --- embeddings -----------------------------------------------------------------------------------
def _ids(n: int, rows: int, skew: float, g: torch.Generator,
         perm: torch.Tensor | None = None) -> torch.Tensor:
    """``n`` ids in ``[0, rows)``: uniform (``skew`` 0) or power-law with exponent ``skew`` (a
    continuous Zipf by inverse transform), the hot ids scattered by ``perm`` as hashing does."""
    if skew <= 0:
        return torch.randint(0, rows, (n,), generator=g)
    u = torch.rand(n, generator=g, dtype=torch.float64)
    a = 1.0 - skew
    x = ((float(rows) ** a - 1.0) * u + 1.0) ** (1.0 / a) if a else float(rows) ** u
    ids = (x.floor().long() - 1).clamp_(0, rows - 1)
    return ids if perm is None else perm[ids]


def _batch(B: int, L: int, rows: list[int], g: torch.Generator, skew: float = 0.0,
           perms: list[torch.Tensor] | None = None) -> tuple[SparseFeatures, int]:
    """A batch of one feature per table of ``rows`` (``L`` ids per sample, each table's drawn
    in its own rows) and its distinct ids (per table)."""
    T = len(rows)
    lengths = torch.full((T, B), L, dtype=torch.int64)
    values = torch.cat([_ids(B * L, n, skew, g, None if perms is None else perms[t])
                        for t, n in enumerate(rows)])
    distinct = sum(int(v.unique().numel()) for v in values.view(T, B * L))
    return SparseFeatures(("",) * T, values, lengths), distinct


def _measure_module(make, cfg: CalibrationConfig, rows: list[int], progress) -> list[dict]:
    """``make(optimizer, rows, dim)``: the module of tables of ``rows`` to time, per dim."""
    from recscale.embedding.tbe import EmbeddingOptimizerConfig

    opt = EmbeddingOptimizerConfig(name=cfg.optimizer)
    pts = []
    T = len(rows)
    g = torch.Generator().manual_seed(0)
    perms = [torch.randperm(n, generator=g) for n in rows]
    for d in cfg.dims:
        mod = make(opt, rows, d)
        try:
            for L, B, skew in itertools.product(cfg.poolings, cfg.batch_sizes, cfg.skews):
                drawn = [_batch(B, L, rows, g, skew, perms) for _ in range(cfg.reps + 1)]
                batches = [b for b, _ in drawn]
                distinct = statistics.mean(n for _, n in drawn[1:])
                before = mod.tier_stats() if hasattr(mod, "tier_stats") else {}

                def step(i, mod=mod, batches=batches):
                    mod(batches[i + 1]).sum().backward()

                t = _median_time(step, cfg.reps)
                after = mod.tier_stats() if hasattr(mod, "tier_stats") else {}
                look = after.get("lookups", 0) - before.get("lookups", 0)
                hits = after.get("hits", 0) - before.get("hits", 0)
                h = hits / look if look else 1.0
                pts.append({"dim": d, "pooling": L, "batch": B, "skew": skew,
                            "ids": T * B * L, "distinct": distinct, "bags": T * B,
                            "seconds": t, "hit_rate": h})
                progress()
        finally:
            if hasattr(mod, "close"):
                mod.close()
    return pts


def _measure_assembly(cfg: CalibrationConfig, num_tables: int, world: int, progress) -> list[dict]:
    """The collection's placing of the pooled vectors it received into the model's
    [B, tables x dim] output, as the runtime runs it (``columns.place_columns``, once per step:
    the flat exchange's per-rank blocks and the replicas' piece, tables in shuffled order; the
    backward gathers the columns back): per output element, whatever the ranks."""
    from recscale.embedding.columns import inverse_permutation, place_columns

    pts = []
    g = torch.Generator().manual_seed(1)
    for d in cfg.dims:
        width = num_tables * d
        order = torch.randperm(num_tables, generator=g)
        cols = (order[:, None] * d + torch.arange(d)).reshape(-1)
        inv = inverse_permutation(cols, width)
        n_dp = num_tables // 3 * d  # a third of the tables replicated, the rest in rank blocks
        blocks = [len(c) * d for c in torch.arange(num_tables - num_tables // 3).chunk(
            max(world, 1))]
        for B in cfg.batch_sizes:
            wide = torch.randn(B * sum(blocks), requires_grad=True)
            dp = torch.randn(B, n_dp, requires_grad=True)
            grad = torch.randn(B, width)

            def step(i, wide=wide, dp=dp, B=B, width=width, blocks=blocks, grad=grad, cols=cols,
                     inv=inv, n_dp=n_dp):
                out = place_columns([wide, dp], [blocks, (n_dp,)], cols, inv, width, B)
                out.backward(grad)
                wide.grad = dp.grad = None

            pts.append({"dim": d, "batch": B, "elements": B * width,
                        "seconds": _median_time(step, max(cfg.reps, 5))})
            progress()
    return pts


# --- dense -------------------------------------------------------------------------------------------
def dense_spec(model_cfg: ModelConfig, num_tables: int, num_dense: int = NUM_DENSE) -> DenseSpec:
    """The dense arch of ``model_cfg`` as the step-time prediction sees it."""
    top_in = interaction_dim(model_cfg, num_tables)
    d = model_cfg.embedding_dim
    if model_cfg.interaction == "dot":  # [B, F, d] x [B, d, F]
        f = num_tables + 1
        return DenseSpec.mlps(num_dense, model_cfg.bottom_mlp, top_in, model_cfg.top_mlp,
                              2.0 * f * f * d, float(f * f * d))
    cross_f = cross_p = 0  # cat: the concatenation; dcn: and the cross layers over it
    n = layers = 0
    if model_cfg.interaction == "dcn":
        n, layers, r = top_in, model_cfg.dcn.num_layers, model_cfg.dcn.low_rank
        cross_f, cross_p = layers * 4 * n * r, layers * (2 * n * r + n)
    return DenseSpec.mlps(num_dense, model_cfg.bottom_mlp, top_in, model_cfg.top_mlp, 0.0,
                          float(top_in + n * layers), float(cross_f), cross_p)


def dense_model(model_cfg: ModelConfig, dim: int) -> ModelConfig:
    """``model_cfg`` with embedding dim ``dim`` (and a bottom MLP ending at it, as the dot
    interaction needs)."""
    bottom = model_cfg.bottom_mlp
    if model_cfg.interaction == "dot":
        bottom = (*bottom[:-1], dim)
    return replace(model_cfg, embedding_dim=dim, bottom_mlp=tuple(bottom))


def _measure_dense(model_cfg: ModelConfig, num_tables: int, cfg: CalibrationConfig, progress):
    """The dense arch's forward + backward (the pooled embeddings' gradient included) + optimizer
    step at each of ``cfg.dims`` (the interaction's cost grows with the dim far from the MLPs'
    FLOP rate) and three batch sizes."""
    loss_fn = torch.nn.BCEWithLogitsLoss()
    pts = []
    # three batch sizes at least (a fixed and a per-FLOP cost are fitted), 5 steps each at least
    sizes = sorted({*cfg.batch_sizes, (min(cfg.batch_sizes) + max(cfg.batch_sizes)) // 2})
    for d in cfg.dims:
        mcfg = dense_model(model_cfg, d)
        torch.manual_seed(0)
        arch = DenseArch(NUM_DENSE, num_tables, mcfg)
        opt = torch.optim.Adam(arch.parameters(), lr=1e-3, foreach=True)
        spec = dense_spec(mcfg, num_tables)
        for B in sizes:
            x = torch.randn(B, NUM_DENSE)
            # the pooled embeddings take a gradient, as in training (the interaction's backward
            # computes it for the embeddings' own backward)
            emb = torch.randn(B, num_tables * d, requires_grad=True)
            y = torch.rand(B).round()

            def step(i, x=x, emb=emb, y=y, arch=arch, opt=opt):
                emb.grad = None
                loss = loss_fn(arch(x, emb), y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()

            mlp = spec.flops_per_sample - spec.interaction_flops_per_sample
            pts.append({"dim": d, "batch": B, "flops": 3 * B * mlp,
                        "interaction": B * spec.interaction_per_sample,
                        "seconds": _median_time(step, max(cfg.reps, 5))})
            progress()
    return pts


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

    pts = {"memory": _measure_module(
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
        pts[f"{tier}_cache"] = _measure_module(make, cfg, [rows], tick)
    pts["dense"] = _measure_dense(model_cfg, num_tables, cfg, tick)
    pts["assembly"] = _measure_assembly(cfg, num_tables, world, tick)
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
                pts["intra_host"] = _measure_comms(cfg.comm_sizes, max(3 * cfg.reps, 7))
                pts["exchange"] = _measure_exchange(ctx, cfg, num_tables)
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
              model_cfg: ModelConfig | None = None, num_tables: int = 26,
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
                    cfg: CalibrationConfig | None = None, num_tables: int = 26,
                    weight_precision: str = "fp32") -> Calibration:
    """``base`` with its constants fitted to measured ``pts`` (a calibration's ``points``, or
    ``median_of_rounds`` of several calibrations' points taken at different times: the same
    ``cfg``, ``num_tables`` and layout)."""
    from recscale.sharding.types import PRECISION_BYTES

    cfg = cfg or CalibrationConfig()
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
