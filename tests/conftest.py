import os
import zlib
from pathlib import Path

import pytest

os.environ.setdefault("DO_NOT_TRACK", "true")
os.environ.setdefault("KEDRO_DISABLE_TELEMETRY", "true")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

PROJECT_ROOT = Path(__file__).resolve().parents[1]


# --- seeds: every random draw in the tests comes from the run's seed ------------------------------
# The run's seed is pytest-randomly's (the header prints "Using --randomly-seed=N"; it also orders
# the tests at random and reseeds `random` and numpy's global state before each test): rerun with
# `-p randomly --randomly-seed=N` to repeat both the order and every draw. Without the plugin
# (`-p no:randomly`), RECSCALE_TEST_SEED or 0.
def run_seed(config) -> int:
    try:
        seed = config.getoption("randomly_seed")
    except ValueError:  # the plugin is off
        seed = None
    if not isinstance(seed, int):
        seed = int(os.environ.get("RECSCALE_TEST_SEED", "0"))
    return seed


@pytest.fixture(scope="session")
def test_seed(pytestconfig) -> int:
    """The run's seed (for fixtures wider than one test)."""
    return run_seed(pytestconfig)


@pytest.fixture
def seed(request) -> int:
    """This test's own seed: the run's, mixed with the test's name (so tests draw differently
    from each other, and each the same whatever ran before it)."""
    return (run_seed(request.config) * 1_000_003 + zlib.crc32(request.node.nodeid.encode())) \
        % (2**32)


@pytest.fixture(autouse=True)
def _seeded(seed):
    """`random`, numpy's and torch's global generators start every test at the test's seed: a
    draw without a generator of its own is reproducible too, whatever ran before it."""
    import random

    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def small_synthetic_config(**overrides):
    from recscale.data.synthetic import SyntheticConfig

    base = dict(num_rows=6000, seed=3, cardinality_scale=0.0005, keep_cardinality_below=200)
    base.update(overrides)
    return SyntheticConfig(**base)


@pytest.fixture(scope="session")
def synthetic_tsv(tmp_path_factory):
    """A small generated Criteo TSV (crosses a generation block boundary: 70,000 rows)."""
    from recscale.data.synthetic import generate_criteo_tsv

    cfg = small_synthetic_config(num_rows=70_000)
    out = tmp_path_factory.mktemp("synthetic") / "day_00.tsv"
    return cfg, generate_criteo_tsv(cfg, out)


@pytest.fixture(scope="session")
def parquet_dataset(synthetic_tsv, tmp_path_factory):
    from recscale.data.preprocess import PreprocessConfig, load_manifest, preprocess_criteo

    cfg, rep = synthetic_tsv
    out = tmp_path_factory.mktemp("parquet")
    preprocess_criteo([rep.path], out, PreprocessConfig(row_group_size=5000), rep.cardinalities)
    return load_manifest(out)


# Spark settings for tests: two cores, small partitions and blocks (so numbering across input
# blocks is exercised), no UI
SPARK_TEST_CONF = {
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.sql.files.maxPartitionBytes": "65536",
    "spark.sql.files.openCostInBytes": "0",
    "spark.driver.memory": "1g",
}


@pytest.fixture(scope="session")
def spark():
    """One local[2] SparkSession shared by every Spark test (a JVM start costs seconds)."""
    from recscale.data.spark_session import SparkConfig, make_spark_session

    spark_session = make_spark_session(SparkConfig(master="local[2]", conf=SPARK_TEST_CONF))
    yield spark_session
    spark_session.stop()


def criteo_frame(files, rows):
    """Lines ``rows`` of Criteo TSV ``files`` (numbered from 0 over the files in order) as a
    pandas DataFrame of their raw values, indexed by row: the label, the counts as numbers (NaN
    where missing), the ids as hex strings (None where missing). What a caller serving raw
    Criteo rows sends."""
    import pandas as pd

    from recscale.data.criteo import COLUMN_NAMES

    lines = [ln for f in files for ln in Path(f).read_text().splitlines()]
    frame = pd.DataFrame([lines[r].split("\t") for r in rows], columns=list(COLUMN_NAMES),
                         index=list(rows)).replace("", None)
    for c in COLUMN_NAMES[:14]:
        frame[c] = pd.to_numeric(frame[c])
    return frame
