"""Command line: plan the sharding of the tables in a YAML file and print the report.

    python -m recscale.sharding --tables tables.yaml --topology zionex --world-size 128 \\
        --batch-size 512 --out plan.json [--chart plan.png] [--comms-forward fp16 ...]

``tables.yaml`` is a list of table dicts with the ``TableSpec`` fields (name, num_embeddings,
embedding_dim, pooling_factor, feature_names, constraints), or a mapping with such a list under
``tables``. Exit status: 0 planned, 2 bad input or the tables do not fit (message on stderr).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from recscale.comm.precision import WIRE_PRECISIONS, CommsConfig
from recscale.config import ConfigError

from .planner import plan_sharding
from .report import save_chart
from .topology import PRESETS, Topology
from .types import OPTIMIZER_STATE, STRATEGIES, WEIGHT_PRECISIONS, PlannerError


def load_tables(path: str | Path) -> list[dict]:
    import yaml

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"--tables={str(path)!r} is not allowed: expected an existing YAML file")
    data = yaml.safe_load(path.read_text())
    if isinstance(data, dict) and "tables" in data:
        data = data["tables"]
    if not isinstance(data, list):
        raise ConfigError(f"--tables={str(path)!r} is not allowed: expected a YAML list of table "
                          "dicts (or a mapping with a 'tables' list)")
    return data


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m recscale.sharding",
                                 description="Plan how embedding tables are sharded over ranks.")
    ap.add_argument("--tables", required=True, help="YAML list of tables (TableSpec fields)")
    ap.add_argument("--topology", default="cpu-local",
                    help=f"a preset ({', '.join(sorted(PRESETS))}) or a topology file written by "
                    "`recscale calibrate`")
    ap.add_argument("--world-size", type=int, default=None, help="default: one host")
    ap.add_argument("--local-world-size", type=int, default=None, help="ranks per host")
    ap.add_argument("--batch-size", type=int, default=512, help="per-rank batch size")
    ap.add_argument("--optimizer", default="exact_rowwise_adagrad", choices=list(OPTIMIZER_STATE))
    ap.add_argument("--weight-precision", default="fp32", choices=list(WEIGHT_PRECISIONS))
    ap.add_argument("--comms", default=None, choices=list(WIRE_PRECISIONS),
                    help="wire precision for every direction")
    for d in ("forward", "backward", "dense-allreduce"):
        ap.add_argument(f"--comms-{d}", default=None, choices=list(WIRE_PRECISIONS))
    ap.add_argument("--memory-fraction", type=float, default=None)
    ap.add_argument("--cache-fraction", type=float, default=None)
    ap.add_argument("--strategy", default="balanced", choices=list(STRATEGIES))
    ap.add_argument("--out", default=None, help="write the plan as JSON here")
    ap.add_argument("--chart", default=None, help="write a PNG chart here")
    ap.add_argument("--max-rows", type=int, default=20, help="table and rank lines in the report")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        tables = load_tables(args.tables)
        if args.topology in PRESETS:
            topo = Topology.preset(args.topology, args.world_size, args.local_world_size)
        else:  # a calibrated file: its own ranks unless told otherwise
            topo = Topology.load(args.topology)
            topo = topo.for_world(args.world_size or topo.world_size, args.local_world_size)
        comms = CommsConfig.coerce(args.comms).to_dict()
        for key, value in (("forward", args.comms_forward), ("backward", args.comms_backward),
                           ("dense_allreduce", args.comms_dense_allreduce)):
            if value is not None:
                comms[key] = value
        kw = {"optimizer": args.optimizer, "weight_precision": args.weight_precision,
              "comms": comms, "strategy": args.strategy}
        if args.memory_fraction is not None:
            kw["memory_fraction"] = args.memory_fraction
        if args.cache_fraction is not None:
            kw["cache_fraction"] = args.cache_fraction
        plan = plan_sharding(tables, topo, args.batch_size, **kw)
    except (ConfigError, PlannerError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(plan.report(max_rows=args.max_rows))
    if args.out:
        print(f"\nplan written to {plan.save(args.out)}")
    if args.chart:
        print(f"chart written to {save_chart(plan, args.chart)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
