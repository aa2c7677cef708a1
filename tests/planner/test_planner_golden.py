"""The golden plans in the suite: the cases of benchmarks/planner_golden.py that planned in
under half a second when recorded (``--fast``, 240 of 311: the inputs of the planner's tests, the
benchmark mixes, seeded random mixes, bad inputs) planned again and hashed, so any change to a
plan, its report, its traffic estimate or an error's text is seen; the full set runs with
``python benchmarks/planner_golden.py`` (about five minutes). The script pins numpy to its AVX2
kernels, so the hashes hold on AVX2-only and AVX-512 machines alike."""

import json
import os
import subprocess
import sys

from tests.conftest import PROJECT_ROOT

SCRIPT = PROJECT_ROOT / "benchmarks" / "planner_golden.py"
HASHES = PROJECT_ROOT / "benchmarks" / "planner_golden.sha256.json"
FAST = PROJECT_ROOT / "benchmarks" / "planner_golden.fast.txt"


def test_the_fast_golden_plans_are_unchanged_and_a_changed_one_is_named(tmp_path):
    fast = FAST.read_text().splitlines()
    golden = json.loads(HASHES.read_text())
    assert len(fast) > 200 and set(fast) <= set(golden)
    # one recorded hash altered: that case, and only it, is reported as changed
    altered = fast[len(fast) // 2]
    hashes = tmp_path / "hashes.json"
    hashes.write_text(json.dumps({**golden, altered: "0" * 64}))
    run = subprocess.run([sys.executable, str(SCRIPT), "--fast", "--hashes", str(hashes)],
                         capture_output=True, text=True, timeout=600, cwd=PROJECT_ROOT,
                         env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT / "src")})
    out = run.stdout + run.stderr
    assert run.returncode == 1, out
    assert [line for line in out.splitlines() if line.startswith(("DIFFERS", "not recorded"))] \
        == [f"DIFFERS: {altered}"], out
    assert f"{len(fast)} cases" in out and "1 differ, 0 not recorded" in out
