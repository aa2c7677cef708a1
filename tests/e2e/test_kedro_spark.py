"""`kedro run --pipelines=dlrm --env=spark` end to end at conf/test's sizes: the project hook starts
the SparkSession from conf/spark/spark.yml, preprocessing runs on Spark, training reads its parquet."""

import json

import pyarrow.parquet as pq
import pytest

from recscale.config import parse
from recscale.data.preprocess import SPLITS, PreprocessConfig, preprocess_criteo
from tests.e2e.project import kedro, make_project_copy

pytestmark = pytest.mark.e2e

TEST_SPARK_YML = """\
master: local[2]
log_level: WARN
conf:
  spark.sql.shuffle.partitions: 2
  spark.ui.enabled: false
  spark.driver.memory: 1g
"""


def test_dlrm_pipeline_on_spark_writes_what_pyarrow_writes_and_trains(tmp_path):
    proj = make_project_copy(tmp_path, base_sizes_from="test")
    (proj / "conf" / "spark" / "spark.yml").write_text(TEST_SPARK_YML)
    res = kedro(proj, "run", "--pipelines=dlrm", "--env=spark")
    out = res.stdout + res.stderr
    assert "Pipeline execution completed successfully" in out
    assert "spark: parts written" in out  # our progress lines stay
    assert "INFO SparkContext" not in out and "[Stage " not in out  # no log4j chatter or bars
    man = json.loads((proj / "data/05_model_input/criteo_parquet_test/_manifest.json").read_text())
    assert man["engine"] == "spark" and man["rows_written"] == 20000 and man["rows_rejected"] == 0
    # the same rows as the pyarrow engine on the same raw file
    cfg = parse(PreprocessConfig, {**man["config"], "engine": "pyarrow",
                                            "table_sizes": man["table_sizes"]}, "preprocess")
    ref = preprocess_criteo([str(proj / f) for f in man["source_files"]], tmp_path / "ref", cfg)
    for s in SPLITS:
        got = pq.read_table([str(proj / f) for f in man["splits"][s]["files"]])
        want = pq.read_table(json.loads(open(ref.manifest_path).read())["splits"][s]["files"])
        assert got.column("row").to_pylist() == want.column("row").to_pylist()
        assert got.select(["label", "C1", "C26"]).equals(want.select(["label", "C1", "C26"]))
    # the run's model scores the raw day on Spark (the day twice: two units, two tasks) as the
    # pyarrow engine does, to the bit
    import mlflow

    from recscale.scoring.files import score_files

    mlflow.set_tracking_uri(f"sqlite:///{proj}/mlruns/mlflow.db")
    runs = mlflow.search_runs(experiment_names=["recscale"])
    uri = f"runs:/{runs.iloc[0]['run_id']}/model"
    day = "data/01_raw/synthetic_test/day_00.tsv"
    (proj / "conf" / "spark" / "parameters_score.yml").write_text(
        f"score:\n  engine: spark\n  model: {uri}\n  data:\n    files: [{day}, {day}]\n")
    res = kedro(proj, "run", "--pipelines=score", "--env=spark")
    assert "spark: 2 units scored" in res.stdout + res.stderr
    got = pq.read_table(proj / "data/07_model_output/scores_test.parquet")
    scorer = mlflow.pyfunc.load_model(uri).unwrap_python_model().scorer
    want = pq.read_table(score_files(scorer, [proj / day] * 2, tmp_path / "ref.parquet",
                                     "criteo_tsv").out_path)
    assert got.num_rows == 40000 and got.equals(want)
