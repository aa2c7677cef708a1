"""Preprocessing against a standalone Spark cluster on this machine: Spark's own master and two
workers (started with the ``bin/spark-class`` script pyspark ships), a driver in its own process
with ``master: spark://...``; the parquet equals the pyarrow engine's. Every wait has a deadline;
the cluster is stopped whatever happens."""

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from recscale.data.preprocess import SPLITS, PreprocessConfig, preprocess_criteo
from tests.conftest import PROJECT_ROOT
from tests.multihost.netns import OWN_GROUP

pytestmark = pytest.mark.e2e


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(port: int, deadline_s: float, who: str, proc: subprocess.Popen, log: Path) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"{who} exited ({proc.returncode}): {log.read_text()[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"{who} did not listen on 127.0.0.1:{port} within {deadline_s:g} s; "
                       f"log: {log.read_text()[-2000:]}")


@pytest.fixture
def standalone_cluster(tmp_path):
    import pyspark

    home = Path(pyspark.__file__).parent
    env = dict(os.environ, SPARK_HOME=str(home), SPARK_LOCAL_IP="127.0.0.1",
               SPARK_LOG_DIR=str(tmp_path / "logs"), SPARK_WORKER_DIR=str(tmp_path / "work"),
               PYSPARK_PYTHON=sys.executable)
    port = _free_port()
    procs: list[subprocess.Popen] = []

    def start(name, *args):
        log = tmp_path / f"{name}.log"
        p = subprocess.Popen([str(home / "bin" / "spark-class"), *args], env=env,
                             stdout=open(log, "w"), stderr=subprocess.STDOUT,
                             **OWN_GROUP)  # os.killpg ends the JVM and what it started
        procs.append(p)
        return p, log

    try:
        master, mlog = start("master", "org.apache.spark.deploy.master.Master", "--host",
                             "127.0.0.1", "--port", str(port), "--webui-port", str(_free_port()))
        _wait_port(port, 90, "the Spark master", master, mlog)
        for i in range(2):
            wport = _free_port()
            w, wlog = start(f"worker{i}", "org.apache.spark.deploy.worker.Worker",
                            f"spark://127.0.0.1:{port}", "--host", "127.0.0.1", "--port",
                            str(wport), "--webui-port", str(_free_port()), "--cores", "1",
                            "--memory", "1g", "--work-dir", str(tmp_path / f"work{i}"))
            _wait_port(wport, 90, f"Spark worker {i}", w, wlog)
        yield f"spark://127.0.0.1:{port}"
    finally:
        for p in reversed(procs):  # our own processes only, each by its process group
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=10)


DRIVER = """
import json, sys
from recscale.data.preprocess import PreprocessConfig, preprocess_criteo
from recscale.data.spark_session import SparkConfig, make_spark_session

master, src, out = sys.argv[1:4]
spark = make_spark_session(SparkConfig(master=master, min_executors=2, start_timeout_s=120, conf={
    "spark.executor.cores": "1", "spark.executor.memory": "512m", "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "2", "spark.sql.files.maxPartitionBytes": "300000",
    "spark.sql.files.openCostInBytes": "0"}))
n = spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1
rep = preprocess_criteo([src], out, PreprocessConfig(engine="spark", row_group_size=1000,
                                                     table_sizes=(1000,) * 26), spark=spark)
print(json.dumps({"executors": n, "rows": rep.rows_written, "manifest": rep.manifest_path}))
spark.stop()
"""


def test_preprocessing_on_a_standalone_master_with_two_workers(standalone_cluster, tmp_path):
    from recscale.data.synthetic import generate_criteo_tsv
    from tests.conftest import small_synthetic_config

    rep = generate_criteo_tsv(small_synthetic_config(num_rows=8000), tmp_path / "day_00.tsv")
    env = dict(os.environ, PYTHONPATH=str(PROJECT_ROOT / "src"))
    res = subprocess.run([sys.executable, "-c", textwrap.dedent(DRIVER), standalone_cluster,
                          rep.path, str(tmp_path / "spark")], env=env, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-4000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got["executors"] == 2 and got["rows"] == 8000
    ref = preprocess_criteo([rep.path], tmp_path / "ref",
                            PreprocessConfig(row_group_size=1000, table_sizes=(1000,) * 26))
    mg = json.loads(Path(got["manifest"]).read_text())
    mr = json.loads(Path(ref.manifest_path).read_text())
    assert mg["table_sizes"] == mr["table_sizes"]
    for s in SPLITS:
        a = pq.read_table(mr["splits"][s]["files"])
        b = pq.read_table(mg["splits"][s]["files"])
        assert b.drop_columns([f"I{i}" for i in range(1, 14)]).equals(
            a.drop_columns([f"I{i}" for i in range(1, 14)])), s
