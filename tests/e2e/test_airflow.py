"""The nightly retrain scheduled by Airflow: kedro-airflow writes its DAG from recscale's template
and conf/base/airflow.yml (the whole retrain one task, nightly at 02:30, no catch-up), and
`airflow dags test` runs one night on toy data in a scratch AIRFLOW_HOME (SQLite): one version
registered, the day consumed once. Skipped, saying why, where Airflow is not installed (`make
test` installs it)."""

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.project import MLFLOW_URIS, kedro, make_project_copy
from tests.e2e.test_daily_use import _params, _state, _write_day

pytestmark = pytest.mark.e2e

BIN = Path(sys.executable).parent


def test_airflow_dags_test_runs_one_nightly_retrain_from_the_generated_dag(tmp_path):
    if not (BIN / "airflow").exists():
        pytest.skip("Airflow is not installed in this environment: `make test` installs it "
                    "(pip install -e '.[airflow]')")
    proj = make_project_copy(tmp_path, base_sizes_from="test")
    kedro(proj, "airflow", "create", "--pipelines=dlrm_retrain", "--group-by=memory",
          "-j", "pipelines/airflow/dag.py.j2", "-t", "airflow_dags")
    dag_file = proj / "airflow_dags" / "recscale_dlrm_retrain_dag.py"
    src = dag_file.read_text()
    ast.parse(src)
    assert src.count("@task(") == 1 and 'task_id="dlrm_retrain"' in src  # one task, whole
    assert 'schedule="30 2 * * *"' in src and "catchup=False" in src
    model = _params(proj, "retrain")["retrain"]["registered_model"]
    _write_day(proj, 1, 6000, 11)
    home = tmp_path / "airflow_home"
    env = dict(os.environ, AIRFLOW_HOME=str(home), DO_NOT_TRACK="true",
               AIRFLOW__CORE__DAGS_FOLDER=str(proj / "airflow_dags"),
               AIRFLOW__CORE__LOAD_EXAMPLES="False",
               AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{home}/airflow.db",
               KEDRO_DISABLE_TELEMETRY="true", MLFLOW_DISABLE_TELEMETRY="true",
               PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    for k in ("KEDRO_LOGGING_CONFIG", *MLFLOW_URIS):
        env.pop(k, None)
    for cmd, limit in ((["db", "migrate"], 300),
                       (["dags", "test", "recscale_nightly_retrain", "2026-12-04"], 600)):
        res = subprocess.run([str(BIN / "airflow"), *cmd], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=limit)
        assert res.returncode == 0, f"airflow {' '.join(cmd)}:\n{res.stdout[-4000:]}\n" \
                                    f"{res.stderr[-4000:]}"
    out = res.stdout + res.stderr
    assert "success" in out.lower()
    after = _state(proj, model)
    assert [v for v, _ in after["versions"]] == [1] and after["alias"] == 1
    assert [e["partition"] for e in json.loads(after["ledger"])["consumed"]] == ["day_01.tsv"]
