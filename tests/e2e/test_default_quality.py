"""The default synthetic config (conf/base) trains to within 0.03 AUC of the generator's oracle.

This runs the library path of `kedro run --pipelines=dlrm` at full default size (about a minute
on 2 cores), because the claim is about the default configuration itself.
"""

import numpy as np
import pytest
import yaml

from recscale.config import parse
from recscale.data.preprocess import PreprocessConfig, load_manifest, preprocess_criteo
from recscale.data.source import DataConfig, prepare_raw
from recscale.model import ModelConfig
from recscale.runconfig import TrainConfig
from recscale.scoring import evaluate_dlrm
from recscale.train import train_dlrm
from tests.conftest import PROJECT_ROOT

pytestmark = pytest.mark.e2e


def test_default_config_reaches_the_oracle_auc_within_0_03(tmp_path):
    params = yaml.safe_load((PROJECT_ROOT / "conf/base/parameters_dlrm.yml").read_text())
    data = parse(DataConfig, {**params["data"], "raw_dir": str(tmp_path / "raw")}, "data")
    pre = dict(params["preprocess"])
    pre.pop("output_dir")
    train = {**params["train"], "progress": "off"}
    raw = prepare_raw(data)
    preprocess_criteo(raw["files"], tmp_path / "pq", parse(PreprocessConfig, pre, "preprocess"),
                      raw["cardinalities"])
    man = load_manifest(tmp_path / "pq")
    out = train_dlrm(man, parse(ModelConfig, params["model"], "model"),
                     parse(TrainConfig, train, "train"))
    m = evaluate_dlrm(out.model, man, "test", 16384, np.load(raw["oracle_path"], mmap_mode="r"))
    print(f"test AUC {m['auc']:.4f}, oracle AUC {m['oracle_auc']:.4f}")
    assert m["oracle_auc"] - m["auc"] < 0.03
    assert 0.95 < m["calibration"] < 1.05
