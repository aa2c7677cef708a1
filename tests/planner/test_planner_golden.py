"""The golden plans in the suite: the cases of benchmarks/planner_golden.py that planned in
under half a second when recorded (``--fast``, about 240 of 311: the inputs of the planner's
tests, the benchmark mixes, seeded random mixes, bad inputs) planned again and hashed, so any
change to a plan, its report, its traffic estimate or an error's text is seen; the full set
runs with ``python benchmarks/planner_golden.py`` (about five minutes)."""

import json
import sys

from tests.conftest import PROJECT_ROOT

sys.path.insert(0, str(PROJECT_ROOT / "benchmarks"))
import planner_golden  # noqa: E402


def test_the_fast_golden_plans_are_unchanged_and_a_changed_one_is_named(tmp_path, monkeypatch,
                                                                         capsys):
    fast = planner_golden.FAST.read_text().splitlines()
    golden = json.loads(planner_golden.HASHES.read_text())
    assert len(fast) > 200 and set(fast) <= set(golden)
    # one recorded hash altered: that case, and only it, is reported as changed
    altered = fast[len(fast) // 2]
    hashes = tmp_path / "hashes.json"
    hashes.write_text(json.dumps({**golden, altered: "0" * 64}))
    monkeypatch.setattr(planner_golden, "HASHES", hashes)
    assert planner_golden.main(["--fast"]) == 1
    out = capsys.readouterr().out
    assert [line for line in out.splitlines() if line.startswith(("DIFFERS", "not recorded"))] \
        == [f"DIFFERS: {altered}"], out
    assert f"{len(fast)} cases" in out and "1 differ, 0 not recorded" in out
