"""What only shows across processes: the planner plans the same under other hash seeds and runs
as a module importing no torch, Kedro or MLflow; preprocessing in worker processes writes the
rows one process writes; a run in the caller's own process gives its threads and memory back."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from recscale.data.preprocess import SPLITS, PreprocessConfig
from tests.unit.test_distributed import BLOCK_PAGES

_RUN_IN_PROCESS = """
import json, torch
from recscale.distributed import threads_for_run
from tests.unit.test_distributed import faults_of_one_step

torch.set_num_threads(2)
with threads_for_run(1) as threads:
    inside = torch.get_num_threads()
    during = [faults_of_one_step() for _ in range(24)]
after = [faults_of_one_step() for _ in range(4)]
print(json.dumps({"threads": threads, "inside": inside, "restored": torch.get_num_threads(),
                  "during": during, "after": after}))
"""


def test_plan_is_identical_across_processes(tmp_path):
    here = str(Path(__file__).parents[1] / "planner")  # test_sharding's mixes
    code = (f"import json, sys; sys.path.insert(0, {here!r}); "
            "from test_sharding import mix, zionex; from recscale.sharding import plan_sharding; "
            "d = plan_sharding(mix(80), zionex(32), 512).to_dict(); "
            "d['summary'].pop('planning_seconds'); print(json.dumps(d))")
    outs = []
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=60, env=env)
        assert res.returncode == 0, res.stderr
        outs.append(res.stdout)
    assert outs[0] == outs[1]


def test_module_runs_and_imports_no_torch_kedro_mlflow(tmp_path):
    tables = tmp_path / "t.yaml"
    tables.write_text("tables:\n  - {name: a, num_embeddings: 1000, embedding_dim: 16}\n")
    code = (f"import sys, runpy; sys.argv = ['x', '--tables', {str(tables)!r}]; "
            "import recscale.sharding; "
            "bad = [m for m in ('torch', 'kedro', 'mlflow') if m in sys.modules]; "
            "assert not bad, bad; runpy.run_module('recscale.sharding', run_name='__main__')")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert "Sharding plan: 1 tables on cpu-local" in res.stdout


def test_days_in_parallel_give_the_same_rows_as_one_process(tmp_path):
    """Three day files, split boundaries falling inside them: 2 worker processes write exactly
    the rows (and row numbers) that one process writes; every line once, in order."""
    from recscale.data.preprocess import preprocess_criteo
    from recscale.data.synthetic import generate_criteo_tsv
    from tests.conftest import small_synthetic_config

    days = [generate_criteo_tsv(small_synthetic_config(num_rows=n, seed=10 + i),
                                tmp_path / f"day_{i}.tsv").path
            for i, n in enumerate((3000, 5000, 2000))]
    cfg = PreprocessConfig(row_group_size=1000, splits=(0.6, 0.2, 0.2))
    one = preprocess_criteo(days, tmp_path / "one", cfg, [50] * 26)
    two = preprocess_criteo(days, tmp_path / "two", PreprocessConfig(
        row_group_size=1000, splits=(0.6, 0.2, 0.2), workers=2), [50] * 26)
    assert one.split_rows == two.split_rows == {"train": 6000, "validation": 2000, "test": 2000}
    from recscale.data.preprocess import load_manifest

    for split in SPLITS:
        a = [pq.read_table(f) for f in load_manifest(tmp_path / "one")["splits"][split]["files"]]
        b = [pq.read_table(f) for f in load_manifest(tmp_path / "two")["splits"][split]["files"]]
        ta, tb = (t[0].__class__.from_batches([x for tt in t for x in tt.to_batches()]) for t in (a, b))
        assert ta.equals(tb)
    rows = np.concatenate([pq.read_table(f).column("row").to_numpy()
                           for s in SPLITS for f in load_manifest(tmp_path / "two")["splits"][s]["files"]])
    assert np.array_equal(rows, np.arange(10_000))


def test_a_run_in_the_callers_process_gives_its_threads_and_memory_back():
    """threads_for_run (training and calibrating inside the user's Kedro or notebook process)
    keeps the memory a step frees during the run, and afterwards the process has its thread
    count back and the memory it kept is the OS's again: the same 64 MiB block is mapped afresh
    (16,384 faults of 4 KiB) the first time after the run. Later allocations may reuse a free
    chunk inside the heap without faults, as glibc's defaults do too."""
    import json
    import platform
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root / "src"), str(root)])}
    proc = subprocess.run([sys.executable, "-c", _RUN_IN_PROCESS], env=env, cwd=root,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (got["threads"], got["inside"], got["restored"]) == (1, 1, 2), got
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return  # another C library's malloc is left as it is
    assert max(got["during"][-4:]) < 0.05 * BLOCK_PAGES, got["during"]
    assert got["after"][0] > 0.9 * BLOCK_PAGES, got["after"]
