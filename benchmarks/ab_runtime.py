"""The sharded training step of this checkout against another checkout's (a baseline commit), in
the same sitting: bench_costmodel's configs (26 Criteo-shaped tables, batch 1,024 per rank, 1
thread per rank, the preset's plan) trained through ``train_dlrm`` by each tree in turn, rounds
alternating so both see the same machine; prints the slowest rank's step, median over rounds,
and the ratio.

    git worktree add /tmp/recscale-base ac811c3
    nice -n 5 python benchmarks/ab_runtime.py --baseline /tmp/recscale-base --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = "2r-d16-mem-fp32,2r-d128-mem-fp32,2r-d128-mem-fp16"

# run inside one tree (its src and benchmarks on the path): the configs' steps as JSON
CHILD = r"""
import json, sys
tree, names, data, steps = sys.argv[1], sys.argv[2].split(","), sys.argv[3], int(sys.argv[4])
sys.path[:0] = [tree + "/benchmarks", tree + "/src"]
from pathlib import Path
import bench_costmodel as bc
from recscale.config import parse
from recscale.data.preprocess import load_manifest
from recscale.train import DLRMConfig, plan_for_run, train_dlrm

def main():
    root = Path(data)
    man = (load_manifest(root / "parquet") if (root / "parquet").exists()
           else bc.make_data(root, 60000))
    out = {}
    for name in names:
        ranks, dim, tier, prec = bc.CONFIGS[name]
        train = {"batch_size_per_rank": 1024, "max_steps": steps, "epochs": 100,
                 "progress": "off", "num_threads": 1, "checkpoint": {"dir": None},
                 "log_every": 1000, "launch": {"world_size": ranks},
                 "embedding_optimizer": {"name": "exact_rowwise_adagrad"},
                 "tiers": {"scratch_dir": str(root / "tiers")}}
        cfg = parse(DLRMConfig, {"model": {"embedding_dim": dim, "bottom_mlp": [128, 64, dim],
                                           "top_mlp": [128, 64, 1]},
                                 "comms": {"forward": prec, "backward": prec},
                                 "sharding": {"topology": "cpu-local"}, "train": train}, "")
        res = train_dlrm(man, cfg.model, cfg.train, plan=plan_for_run(man, cfg),
                         comms=cfg.comms).result.extra
        out[name] = max(res[f"rank{r}.step_ms"] for r in range(ranks))
    print("RESULT " + json.dumps(out), flush=True)

if __name__ == "__main__":
    main()
"""


def run_tree(tree: Path, names: str, data: Path, steps: int, script: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree / "src"), DO_NOT_TRACK="true")
    try:
        p = subprocess.run([sys.executable, str(script), str(tree), names, str(data), str(steps)],
                           env=env, capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired as e:
        raise SystemExit(f"{tree}: its run of {names} did not finish within 900 s") from e
    line = next((x for x in p.stdout.splitlines() if x.startswith("RESULT ")), None)
    if p.returncode or line is None:
        raise SystemExit(f"{tree}: exit {p.returncode}\n{(p.stdout + p.stderr)[-3000:]}")
    return json.loads(line[len("RESULT "):])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", required=True, help="another checkout of recscale (a worktree)")
    ap.add_argument("--configs", default=DEFAULT, help="bench_costmodel config names")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=60)
    args = ap.parse_args(argv)
    trees = {"baseline": Path(args.baseline).resolve(), "this": ROOT}
    for t in trees.values():
        if not (t / "src" / "recscale").is_dir():
            raise SystemExit(f"--baseline: {t} is not a recscale checkout (no src/recscale)")
    got: dict[str, dict[str, list[float]]] = {k: {} for k in trees}
    with tempfile.TemporaryDirectory(prefix="ab-runtime-") as tmp:
        script = Path(tmp) / "child.py"
        script.write_text(CHILD)
        data = Path(tmp) / "data"
        for rnd in range(args.rounds):
            for name, tree in trees.items():
                for cfg, ms in run_tree(tree, args.configs, data, args.steps, script).items():
                    got[name].setdefault(cfg, []).append(ms)
            print(f"round {rnd + 1}/{args.rounds}: " + ", ".join(
                f"{c} {got['baseline'][c][-1]:.1f} -> {got['this'][c][-1]:.1f} ms"
                for c in got["this"]), flush=True)
    print(f"\nslowest rank's step (ms), median of {args.rounds} rounds, {args.steps} steps each")
    print(f"{'config':<18} {'baseline':>9} {'this':>9} {'this / baseline':>16}")
    for c in got["this"]:
        b, t = statistics.median(got["baseline"][c]), statistics.median(got["this"][c])
        print(f"{c:<18} {b:>9.1f} {t:>9.1f} {t / b:>16.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
