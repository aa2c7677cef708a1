"""``recscale calibrate``: measure this machine and write a topology file for the planner.

    recscale calibrate --out data/06_models/topology.yml
    kedro run --pipeline=dlrm --params=sharding.topology=data/06_models/topology.yml

The link between hosts, one process on each host (host 0 serves at the endpoint and writes the
file: the base's fields with ``inter_node_lat_s``, ``inter_node_bw``, ``inter_node_burst_bytes``
measured, and ``inter_node_cpu_s`` / ``inter_node_cpu_bw`` fitted on training steps run across
the link with host 0's base and ``--bottom-mlp`` / ``--top-mlp``):

    recscale calibrate --link-endpoint 10.0.0.1:29600 --link-rank 0 --link-hosts 2 \
        --base data/06_models/topology.yml --out data/06_models/topology.yml   # on host 0
    recscale calibrate --link-endpoint 10.0.0.1:29600 --link-rank 1 --link-hosts 2   # host 1

Measures (``recscale.measure``), on the ranks a run puts on this machine, the lookup +
fused update rate per memory tier, the collectives between them and the dense arch's step, in seconds to a minute, and writes the
base preset's fields with the measured values. Exits 2 with a message where it cannot run (e.g. the
SSD tier's directory cannot be written).
"""

from __future__ import annotations

import argparse
import logging
import sys


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of integers") from None


def calibrate_main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="recscale calibrate", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="data/06_models/topology.yml",
                   help="topology file to write (YAML; default %(default)s)")
    p.add_argument("--base", default="cpu-local", help="preset (or topology file) whose fields "
                   "are measured (default %(default)s; capacities and unmeasured links are kept)")
    p.add_argument("--scratch-dir", default="", help="directory of the SSD-backed cache files "
                   "(default: the system temp directory)")
    p.add_argument("--tiers", default="memory,ddr,ssd", help="tiers to measure: memory and any "
                   "of ddr, ssd (default %(default)s)")
    p.add_argument("--dims", type=_ints, default=(16, 128), help="embedding dims (default 16,128)")
    p.add_argument("--batch", type=int, default=1024, help="the run's batch per rank: measured "
                   "at it and a quarter of it (a step is not linear in the batch far from it; "
                   "default %(default)s)")
    p.add_argument("--tables", type=int, default=None, help="the run's tables: the exchange is "
                   "measured with as many, so its messages are the size a step sends (default: "
                   "as many as --table-rows gives, else the Criteo preset's 26)")
    p.add_argument("--table-rows", type=_ints, default=(), help="the run's tables' rows, "
                   "comma-separated (a dataset manifest's table_sizes): the in-memory tier is "
                   "measured on tables of these sizes (a lookup's cost per id grows with them; "
                   "default: 4 tables of 20,000 rows)")
    p.add_argument("--bottom-mlp", type=_ints, default=None, help="the run's bottom MLP widths "
                   "(model.bottom_mlp; default ModelConfig's): the dense step is measured with it")
    p.add_argument("--top-mlp", type=_ints, default=None, help="the run's top MLP widths "
                   "(model.top_mlp; default ModelConfig's)")
    p.add_argument("--reps", type=int, default=3, help="timed repetitions per point (default 3)")
    p.add_argument("--rounds", type=int, default=3, help="sweeps over all points, each point's "
                   "median over them (a shared machine's speed drifts; default 3)")
    p.add_argument("--min-seconds", type=float, default=20.0, help="then more sweeps until "
                   "this long (a spell of a shared machine's cores outlasts a short calibration; "
                   "default %(default)s)")
    p.add_argument("--merge", action="store_true", help="fit the median of this calibration's "
                   "points and the earlier ones kept beside --out (<out>.points.json, the last "
                   "10): on a machine whose speed drifts for minutes, calibrations taken at "
                   "different times sample it better than one")
    p.add_argument("--ranks-per-host", type=int, default=None, help="ranks that train on this "
                   "machine (default: the base's); they measure at the same time, as they train")
    p.add_argument("--no-comms", action="store_true", help="keep the base's link figures")
    p.add_argument("--progress", default="auto", choices=("auto", "bar", "log", "off"))
    p.add_argument("--link-endpoint", default=None, help="measure only the link between hosts: "
                   "host 0's address:port, one process per host")
    p.add_argument("--link-rank", type=int, default=0, help="this host's index (0 writes --out)")
    p.add_argument("--link-hosts", type=int, default=2, help="hosts measuring the link")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the other "
                   "hosts (default %(default)s)")
    args = p.parse_args(argv)
    if args.tables is None:  # the run's tables, else the Criteo preset's
        from recscale.measure.config import preset_shape

        args.tables = len(args.table_rows) or preset_shape()[1]
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("torch.distributed.elastic", "torch.distributed.launcher"):
        logging.getLogger(noisy).setLevel(logging.WARNING)

    from recscale.config import ConfigError
    from recscale.measure.config import CalibrationConfig, CalibrationError, config_for_run
    from recscale.measure.history import merge_calibrations, points_path
    from recscale.measure.machine import calibrate
    from recscale.model import ModelConfig
    from recscale.sharding import Topology

    try:
        cfg = config_for_run(args.batch, args.table_rows, dims=args.dims, reps=args.reps,
                             rounds=args.rounds, min_seconds=args.min_seconds,
                             max_rounds=max(CalibrationConfig.max_rounds, args.rounds),
                             scratch_dir=args.scratch_dir,
                             tiers=tuple(t for t in args.tiers.split(",") if t),
                             comms=not args.no_comms)
        base = (Topology.load(args.base) if args.base.endswith((".yml", ".yaml", ".json"))
                else Topology.preset(args.base, local_world_size=args.ranks_per_host))
        model = ModelConfig(**{k: v for k, v in (("bottom_mlp", args.bottom_mlp),
                                                  ("top_mlp", args.top_mlp)) if v})
        if args.link_endpoint:
            return _link(args, cfg, base, model)
        cal = calibrate(base, cfg, model, num_tables=args.tables, progress_mode=args.progress)
        cal, merged = merge_calibrations(base, cal, points_path(args.out), cfg, args.tables,
                                         merge=args.merge)
    except (CalibrationError, ConfigError) as e:
        print(f"recscale calibrate: {e}", file=sys.stderr)
        return 2
    path = cal.topology.save(args.out)
    print(format_calibration(cal))
    print(f"wrote {path} in {cal.seconds:.1f} s ({cal.sweeps} sweeps"
          + (f"; the median with {merged} earlier calibration(s) in {points_path(args.out)}"
             if merged else "") + f"); plan with sharding.topology={path}")
    return 0


def _link(args, cfg, base, model) -> int:
    """``--link-endpoint``: the link between hosts into ``base`` (host 0 writes ``--out``)."""
    from dataclasses import replace

    from recscale.measure.link import measure_link

    got = measure_link(args.link_rank, args.link_hosts, args.link_endpoint, cfg, args.timeout,
                       base=base, tables=args.tables, model_cfg=model)
    cpu, cpu_s, burst = (got["inter_node_cpu_bw"], got["inter_node_cpu_s"],
                         got["inter_node_burst_bytes"])
    print(f"link across {args.link_hosts} hosts: latency {got['inter_node_lat_s'] * 1e6:.0f} us "
          f"per call, {got['inter_node_bw'] / 1e6:.1f} MB/s per rank beyond a burst of "
          f"{burst / 1e3:.0f} KB per call (fit error {got['fit']['fit_rel_err']:.2f}); the "
          "ranks' own CPU beyond one host's: "
          + (f"{cpu_s * 1e3:.2f} ms a step" if cpu_s else "none a step") + " and "
          + (f"a byte sent across per {1 / cpu * 1e9:.2f} ns" if cpu else "none per byte"))
    if got["rate_fit"]:
        r = got["rate_fit"]
        print(f"  the link's rate: the exchange alone {got['exchange_bw'] / 1e6:.1f} MB/s, x "
              f"{r['factor']:.2f} in the training steps (their communication predicted within "
              f"{r['fit_rel_err']:.1%} of the step, {r['rel_err_at_1']:.1%} at the exchange's "
              "rate)")
    for p in got["steps"]:  # what that was fitted on
        print(f"  the training step across the link at dim {p['dim']}: {p['seconds'] * 1e3:.2f} "
              f"ms measured ({p['comm'] * 1e3:.2f} communicating), {p['predicted'] * 1e3:.2f} "
              f"ms predicted without the link's CPU cost ({p['predicted_comm'] * 1e3:.2f}), "
              f"{p['bytes_across'] / 1e6:.2f} MB sent across by a rank")
    if args.link_rank == 0:
        topo = replace(base, inter_node_lat_s=got["inter_node_lat_s"],
                       inter_node_bw=got["inter_node_bw"], inter_node_cpu_bw=cpu,
                       inter_node_cpu_s=cpu_s,
                       inter_node_burst_bytes=burst)
        print(f"wrote {topo.save(args.out)}")
    return 0


def format_calibration(cal) -> str:
    """The fitted constants, one line per part."""
    from recscale.measure.steps import predict_host_steps

    lines = []
    for part, fit in cal.fits.items():
        lines.append(f"{part:>12}: " + ", ".join(f"{k} {v:.3g}" for k, v in fit.items()))
    if "host_steps" in cal.fits:  # what the exchange's work was fitted on
        f = cal.fits["host_steps"]
        lines.append(f"  the exchange's work: x {1 / f['factor']:.2f} the exchange alone's in "
                     f"the training steps (predicted within {f['fit_rel_err']:.1%} of the step, "
                     f"{f['rel_err_at_1']:.1%} at the exchange alone's)")
        for p in predict_host_steps(cal.points["host_steps"], cal.topology, factors=(1.0,)):
            lines.append(f"  the training step on this host at dim {p['dim']}: "
                         f"{p['seconds'] * 1e3:.2f} ms measured ({p['comm'] * 1e3:.2f} "
                         f"communicating), {p['predicted'] * 1e3:.2f} ms predicted "
                         f"({p['predicted_comm'] * 1e3:.2f})")
    return "\n".join(lines)
