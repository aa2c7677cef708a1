"""A misspelt key in any config source stops the run before any work, naming the key and the
nearest known one: each block of the DLRM parameters (with the feature schema, the generator,
the splits and the planner's options), the retrain, score, tune and Hessian-free blocks, a
logged model's blocks read by serving, and spark.yml. The blocks themselves are checked
against hooks.PARAMETER_BLOCKS (tests/unit/test_config.py, tests/e2e/test_kedro_params.py)."""

import pytest

from recscale.config import ConfigError, parse
from recscale.data.spark_session import SparkConfig
from recscale.hf.config import MnistJobConfig, SpeechJobConfig
from recscale.pipelines.common import DLRM_BLOCKS, parse_dlrm_config
from recscale.retrain import DLRMRetrainConfig
from recscale.scoring.config import ScoreConfig
from recscale.tune import TuneConfig

SCHEMA = {"label": "click", "sparse": [{"name": "user"}]}


def _dlrm(**blocks):
    blocks.setdefault("features", "criteo")
    return parse_dlrm_config(*(blocks.get(b) or {} for b in DLRM_BLOCKS))


CASES = [
    ("train", lambda: _dlrm(train={"epoch": 2}), "train.epoch", "epochs"),
    ("train nested", lambda: _dlrm(train={"checkpoint": {"every_step": 5}}),
     "train.checkpoint.every_step", "every_steps"),
    ("model", lambda: _dlrm(model={"top_mpl": [8, 1]}), "model.top_mpl", "top_mlp"),
    ("preprocess", lambda: _dlrm(preprocess={"row_group_sise": 5}),
     "preprocess.row_group_sise", "row_group_size"),
    ("splits by time", lambda: _dlrm(features=SCHEMA, data={"source": "synthetic"},
                                     preprocess={"splits": {"by": "ts", "test_form": 1}}),
     "preprocess.splits.test_form", "test_from"),
    ("data.generator", lambda: _dlrm(features=SCHEMA, data={
        "source": "synthetic", "generator": {"num_row": 5}}), "data.generator.num_row",
     "num_rows"),
    ("features", lambda: _dlrm(features={"label": "click", "sparse": [{"name": "u",
                                                                       "id_tpye": "int"}]}),
     "features.sparse[0].id_tpye", "id_type"),
    ("sharding options", lambda: _dlrm(sharding={"options": {"strategi": "greedy"}}),
     "sharding.options.strategi", "strategy"),
    ("comms", lambda: _dlrm(comms={"forwad": "fp16"}), "comms.forwad", "forward"),
    ("evaluate", lambda: _dlrm(evaluate={"baseline": ["rate"]}), "evaluate.baseline",
     "baselines"),
    ("retrain", lambda: parse(DLRMRetrainConfig, {"retrain": {"eval_fractoin": 0.1}}, ""),
     "retrain.eval_fractoin", "eval_fraction"),
    ("score", lambda: parse(ScoreConfig, {"outptu": "x.parquet"}, "score"), "score.outptu",
     "output"),
    ("tune", lambda: parse(TuneConfig, {"trails": 3}, "tune"), "tune.trails", "trials"),
    ("hf", lambda: parse(MnistJobConfig, {"optimizer": {"dampin": 1.0}}, "hf"),
     "hf.optimizer.dampin", "damping"),
    ("hf_speech", lambda: parse(SpeechJobConfig, {"train": {"epoch": 3}}, "hf_speech"),
     "hf_speech.train.epoch", "epochs"),
    ("spark.yml", lambda: parse(SparkConfig, {"mastr": "local[2]"}, "spark"), "spark.mastr",
     "master"),
]


@pytest.mark.parametrize("make, key, nearest", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_misspelt_key_in_each_config_source_names_it_and_the_nearest(make, key, nearest):
    with pytest.raises(ConfigError) as e:
        make()
    msg = str(e.value)
    assert key in msg and f"did you mean '{nearest}'" in msg, msg
