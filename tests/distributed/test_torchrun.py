"""The training entry point under torchrun (2 processes on gloo): both ranks exit 0 and both
return the same trained model, every train row trained once, no rank's scratch directory
(rank 0's holds the model every rank reads back) is left behind, and each rank's process has
the memory training kept handed back to the OS afterwards."""

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from recscale.config import parse
from recscale.data.loader import count_rows
from recscale.runconfig import DLRMConfig, plan_for_run
from tests.unit.test_distributed import BLOCK_PAGES

pytestmark = pytest.mark.dist

PARAMS = {"model": {"embedding_dim": 16, "bottom_mlp": [32, 16], "top_mlp": [32, 1]},
          "train": {"batch_size_per_rank": 2048, "progress": "off", "log_every": 5,
                    "checkpoint": {"dir": None}, "num_threads": 1,
                    "launch": {"world_size": 2, "collective_timeout_s": 60}}}


def test_both_torchrun_ranks_run_the_training_node_and_exit_zero(parquet_dataset, tmp_path):
    cfg = parse(DLRMConfig, PARAMS, "")
    plan = plan_for_run(parquet_dataset, cfg)
    files = {}
    for name, obj in (("manifest", parquet_dataset), ("plan", plan.to_dict()), ("params", PARAMS)):
        files[name] = tmp_path / f"{name}.json"
        files[name].write_text(json.dumps(obj))
    entry = Path(__file__).with_name("torchrun_entry.py")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(entry), str(files["manifest"]), str(files["plan"]), str(files["params"]),
           str(tmp_path / "rank{rank}.json")]
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = dict(os.environ, TMPDIR=str(scratch), PYTHONPATH=os.pathsep.join([str(Path(__file__).parents[2]),
                                                        os.environ.get("PYTHONPATH", "")]))
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-6000:]
    got = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    rows = count_rows(parquet_dataset["splits"]["train"]["files"])
    assert got[0]["samples"] == got[1]["samples"] == rows
    assert got[0]["checksum"] == got[1]["checksum"]
    assert got[0]["history_points"] >= 1
    if platform.system() == "Linux" and platform.libc_ver()[0] == "glibc":
        # each rank's process has the memory training kept handed back (threads_for_run)
        for g in got:
            assert g["faults_after"][0] > 0.9 * BLOCK_PAGES, g["faults_after"]
    assert sorted(p.name for p in scratch.glob("recscale-train-*")) == []
