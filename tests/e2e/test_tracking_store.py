"""An unreachable MLflow store fails a `kedro run` in seconds, before any data or training."""

import socket
import time

import pytest

from recscale.hooks import TrackingStoreUnreachable, check_tracking_store
from tests.e2e.project import kedro, make_project_copy

pytestmark = pytest.mark.e2e


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_an_unreachable_tracking_server_fails_the_run_in_seconds(tmp_path):
    proj = make_project_copy(tmp_path)
    uri = f"http://127.0.0.1:{_closed_port()}"
    (proj / "conf/test/mlflow.yml").write_text(f"server:\n  mlflow_tracking_uri: {uri}\n")
    t0 = time.perf_counter()
    res = kedro(proj, "run", "--pipelines=dlrm", "--env=test", check=False, timeout=120)
    took = time.perf_counter() - t0
    assert res.returncode != 0
    assert f"MLflow tracking server {uri} is unreachable" in res.stdout + res.stderr
    assert took < 30, f"took {took:.0f} s"  # MLflow's own retries would take minutes
    assert not (proj / "data/05_model_input").exists()  # nothing ran


def test_the_store_check_accepts_a_sqlite_store_and_names_a_bad_folder(tmp_path):
    check_tracking_store(f"sqlite:///{tmp_path}/mlflow.db")
    with pytest.raises(TrackingStoreUnreachable, match="nowhere/deeper does not exist"):
        check_tracking_store(f"sqlite:///{tmp_path}/nowhere/deeper/mlflow.db")
