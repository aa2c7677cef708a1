import os
import zlib
from pathlib import Path

import pytest

os.environ.setdefault("DO_NOT_TRACK", "true")
os.environ.setdefault("KEDRO_DISABLE_TELEMETRY", "true")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
# torch's OpenMP threads sleep while they wait instead of spinning: the suite runs several processes
# per core (xdist workers, their ranks, kedro commands), and a spinning thread holds the core
# another process's threads need (two copies of tests/integration/test_reinit_embeddings.py side
# by side on 2 vCPU: 284 s each spinning, 46 s each passive; alone 34 s against 45 s). Set before
# anything loads torch, so the workers and every process they start inherit it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

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


# --- the order files start in under pytest-xdist --------------------------------------------------
# `make test` runs the whole suite on three workers, a file to a worker (`--dist loadfile
# --no-loadscope-reorder`): the files that take longest start first, so no worker is left with a
# long file at the end while the others idle (longest-first packing). Seconds of wall time each
# took in a `make test` on 2 vCPU (AMD EPYC, AVX2), three workers sharing the cores; files not
# named here follow in pytest-randomly's order, and a file's tests keep their own order.
LONGEST_FIRST = [
    "tests/multihost/test_jobs.py",                 # ~255 (with test_host_loss.py, one file: 460)
    "tests/e2e/test_default_quality.py",            # 213
    "tests/multihost/test_host_loss.py",            # ~205
    "tests/planner/test_sharding_properties.py",    # 200
    "tests/e2e/test_daily_use.py",                  # 118
    "tests/distributed/test_teardown.py",           # 103
    "tests/planner/test_sharding_balance.py",       # 102
    "tests/multihost/test_kedro_cluster.py",        # 89
    "tests/planner/test_sharding.py",               # 75
    "tests/integration/test_tune.py",               # 74
    "tests/planner/test_option_search.py",          # 73
    "tests/integration/test_average.py",            # 68
    "tests/e2e/test_airflow.py",                    # 67
    "tests/distributed/test_runtime.py",            # 63
    "tests/e2e/test_kedro_dlrm.py",                 # 62
    "tests/integration/test_reinit_embeddings.py",  # 59
    "tests/integration/test_spark_preprocess.py",   # 58
    "tests/e2e/test_kedro_params.py",               # 56
    "tests/e2e/test_kedro_features.py",             # 54
    "tests/planner/test_sharding_exact.py",         # 51
    "tests/e2e/test_spark_standalone.py",           # 48
]


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


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
