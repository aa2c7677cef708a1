"""A night that fails half way: the driver SIGKILLed after training, before registering
(``retrain.fault_injection: kill_before_register``) leaves the ledger, the alias, the registry
and the latest model as they were; the same command run again resumes from that night's own
checkpoint (no step trained twice), registers exactly one version and consumes the day once."""

import json

import pytest

from tests.e2e.project import kedro, make_project_copy
from tests.e2e.test_daily_use import NIGHTLY, _params, _state, _write_day

pytestmark = pytest.mark.e2e


def test_a_night_killed_before_registering_changes_nothing_and_its_rerun_resumes(tmp_path):
    proj = make_project_copy(tmp_path, base_sizes_from="test")
    model = _params(proj, "retrain")["retrain"]["registered_model"]
    _write_day(proj, 1, 6000, 7)
    before = _state(proj, model)
    res = kedro(proj, "run", "--config", NIGHTLY, "--params=retrain.fault_injection="
                "kill_before_register", check=False)
    assert res.returncode != 0 and "killing this process" in res.stderr
    assert "Completed node: train_challenger" in res.stderr
    assert _state(proj, model) == before  # no version, no alias, no ledger, no latest model
    res = kedro(proj, "run", "--config", NIGHTLY)
    assert "resumed from" in res.stderr  # the killed night's checkpoint, at its last step
    after = _state(proj, model)
    assert [v for v, _ in after["versions"]] == [1] and after["alias"] == 1
    ledger = json.loads(after["ledger"])["consumed"]
    assert [e["partition"] for e in ledger] == ["day_01.tsv"]
    assert "night-" in ledger[0]["checkpoint"]
