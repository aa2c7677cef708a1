"""conf/mlperf_dcnv2 (DLRM-DCNv2 on multi-hot data) end to end at toy size: the dlrm pipeline in
this process with the env's parameters, only rows and paths made small."""

import pyarrow.parquet as pq
import pytest

from recscale.data.preprocess import load_manifest
from tests.e2e.project import run_in_process

pytestmark = pytest.mark.e2e


def test_mlperf_dcnv2_env_trains_dcn_on_multi_hot_bags_and_reports_the_oracle(tmp_path):
    # enough rows that the model learns (62 steps of 256): at 4,000 (13 steps) its test AUC was
    # chance, 0.46
    params = {"data": {"raw_dir": str(tmp_path / "raw"), "synthetic": {"num_rows": 20_000}},
              "preprocess": {"output_dir": str(tmp_path / "pq"), "row_group_size": 1000},
              "train": {"batch_size_per_rank": 256,
                        # the env's decay over the second half of its steps, here of 62
                        "dense_optimizer": {"decay_start_step": 31, "decay_steps": 31},
                        "checkpoint": {"dir": str(tmp_path / "ckpt")}}}
    out = run_in_process("dlrm", env="mlperf_dcnv2", params=params)
    report = out["evaluation_report"].load()
    # the data carries signal (its oracle, the true click probabilities, ranks far above chance)
    # and the model learned most of it (0.82 against 0.92 here) without beating the oracle
    # beyond the noise of 2,000 rows
    assert report["oracle_auc"] > 0.85
    assert 0.75 < report["auc"] < report["oracle_auc"] + 0.01
    assert report["count"] == 2000  # the test split: 10% of the rows, none rejected
    manifest = load_manifest(tmp_path / "pq")
    kinds = {f["kind"] for f in manifest["schema"]["schema"]["sparse"]}
    assert kinds == {"multi_hot"} and manifest["rows_rejected"] == 0
    # the env's ids: a vocabulary of the train split, a table row per kept id and row 0
    assert manifest["ids"] == "vocab" and manifest["vocabulary_path"]
    vocab = pq.read_table(manifest["vocabulary_path"]).group_by("feature").aggregate(
        [("id", "count")]).to_pydict()
    kept = dict(zip(vocab["feature"], vocab["id_count"]))
    names = [f["name"] for f in manifest["schema"]["schema"]["sparse"]]
    assert manifest["table_sizes"] == [kept.get(n, 0) + 1 for n in names]
    assert manifest["pooling_factors"][20] > 50  # C21: MLPerf's 100-id bags, minus missing ones
    metrics = out["training_metrics"].load()
    assert metrics["samples"]["value"] == 16_000  # every training row, once


def test_mlperf_dcnv2_parameters_parse_to_the_dcn_model_on_multi_hot_data():
    from kedro.config import OmegaConfigLoader

    from recscale.pipelines.common import DLRM_BLOCKS, parse_dlrm_config
    from tests.conftest import PROJECT_ROOT

    params = OmegaConfigLoader(str(PROJECT_ROOT / "conf"), base_env="base",
                               default_run_env="mlperf_dcnv2",
                               merge_strategy={"parameters": "soft"})["parameters"]
    cfg = parse_dlrm_config(*(params[b] for b in DLRM_BLOCKS))
    assert cfg.model.interaction == "dcn" and cfg.model.dcn.num_layers == 3
    assert cfg.data.synthetic.multi_hot and sum(cfg.data.synthetic.pooling_factors) == 214
