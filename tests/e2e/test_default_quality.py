"""The default synthetic config (conf/base) trains to within 0.03 AUC of the generator's oracle,
beats the cheap baselines on the same rows, and its run is the one recorded
(tests/e2e/golden/default_run.json): the parquet bytes, the manifest, the plan, and on the
recorded machine's CPU a bitwise identical model.

This runs the library path of `kedro run --pipelines=dlrm` at full default size (about a minute
on 2 cores), because the claim is about the default configuration itself.
"""

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from recscale.config import parse
from recscale.data.preprocess import PreprocessConfig, load_manifest, preprocess_criteo
from recscale.data.schema import FittedSchema, criteo_schema
from recscale.data.source import DataConfig, prepare_raw
from recscale.evaluate import lift_metrics, metrics_with_oracle
from recscale.runconfig import DLRMConfig, plan_for_run
from recscale.scoring import score_split
from recscale.scoring.baselines import baselines_on_split
from recscale.train import train_dlrm
from tests.conftest import PROJECT_ROOT

pytestmark = pytest.mark.e2e

GOLDEN = json.loads((Path(__file__).parent / "golden" / "default_run.json").read_text())


def _sha(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _relative_manifest(m: dict, root: Path) -> dict:
    """The manifest with its paths relative to the run's folder and without the fitted schema
    (checked on its own)."""
    m = json.loads(json.dumps(m))
    m.pop("schema", None)
    for s in m["splits"].values():
        s["files"] = [os.path.relpath(f, root) for f in s["files"]]
    m["source_files"] = [os.path.relpath(f, root) for f in m["source_files"]]
    for k in ("rejects_path", "manifest_path", "vocabulary_path", "row_counts_path"):
        if m.get(k):
            m[k] = os.path.relpath(m[k], root)
    m["config"]["output_dir"] = "pq"
    return m


def _model_sha(state: dict) -> str:
    h = hashlib.sha256()
    for k in sorted(state):
        h.update(k.encode())
        h.update(state[k].detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def _cpu_model() -> str:
    try:
        return next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                    if line.startswith("model name"))
    except (OSError, StopIteration):
        return ""


def test_default_config_reaches_the_oracle_auc_within_0_03_as_recorded(
        tmp_path):
    params = yaml.safe_load((PROJECT_ROOT / "conf/base/parameters_dlrm.yml").read_text())
    data = parse(DataConfig, {**params["data"], "raw_dir": str(tmp_path / "raw")}, "data")
    pre = dict(params["preprocess"])
    pre.pop("output_dir")
    train = {**params["train"], "progress": "off", "checkpoint": {"dir": None}}
    raw = prepare_raw(data)
    preprocess_criteo(raw["files"], tmp_path / "pq", parse(PreprocessConfig, pre, "preprocess"),
                      raw["cardinalities"])
    man = load_manifest(tmp_path / "pq")
    # the Criteo preset (with a vocabulary of the train split's ids) writes the recorded bytes
    assert {s: [_sha(f) for f in man["splits"][s]["files"]] for s in man["splits"]} \
        == GOLDEN["files"]
    assert _relative_manifest(man, tmp_path) == GOLDEN["manifest"]
    fitted = FittedSchema.of(man)
    assert fitted.schema == criteo_schema(ids=pre["ids"]) \
        and list(fitted.table_rows) == man["table_sizes"]
    cfg = parse(DLRMConfig, {**params, "train": train}, "")
    plan = plan_for_run(man, cfg).to_dict()
    plan.get("summary", {}).pop("planning_seconds", None)
    assert json.loads(json.dumps(plan)) == GOLDEN["plan"]
    out = train_dlrm(man, cfg.model, cfg.train)
    machine = GOLDEN["model_machine"]
    if (torch.backends.cpu.get_cpu_capability(), _cpu_model()) == \
            (machine["cpu_capability"], machine["cpu_model"]):
        assert _model_sha(out.model.state_dict()) == GOLDEN["model_sha256"]
    s = score_split(out.model, man, "test", 16384)
    m = metrics_with_oracle(s.labels, s.probs, s.rows, np.load(raw["oracle_path"], mmap_mode="r"))
    print(f"test AUC {m['auc']:.4f}, oracle AUC {m['oracle_auc']:.4f}")
    assert m["oracle_auc"] - m["auc"] < 0.03
    assert 0.95 < m["calibration"] < 1.05
    # and it beats the cheap baselines fitted on the same train split, on the same rows
    b = baselines_on_split(man, "test", ("logreg", "rate"), 16384, rows=s.rows)
    lift = lift_metrics(s.labels, s.probs, b.scores.probs)
    print(f"lift over {lift['best']}: AUC {lift['lift.auc']:+.4f}, log loss {lift['lift.logloss']:+.4f}")
    assert lift["lift.auc"] > 0.02 and lift["lift.logloss"] > 0.02
    # the validation points ran, and the model is the best one's
    assert out.result.extra["validation_points"] == 8  # 4 an epoch, 2 epochs
    assert out.result.extra["best_step"] in (195, 391, 586, 782, 977, 1173, 1368, 1564)
