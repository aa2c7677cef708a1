"""The README's multi-host commands, run as written inside two namespace hosts: `recscale secret`
once, the driver `kedro run --pipeline=dlrm --env=cluster` (toy sizes: conf/test merged into the
copy's base, and --params for the ranks per host), the other host `recscale join --endpoint
<driver>:29400 --secret-file <its copy of the secret>`; and the secret shows nowhere: not in a
log line of either host, an MLflow param, tag or artifact."""

import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.project import make_project_copy
from tests.multihost.harness import KW, _env, wait

pytestmark = pytest.mark.multihost


def test_the_readme_commands_train_one_job_on_two_hosts_with_one_mlflow_run(
        netns_hosts, tmp_path):
    hosts = netns_hosts(2)
    proj = make_project_copy(tmp_path, base_sizes_from="test")
    ep = f"{hosts[0].addr}:29400"
    bin_dir = Path(sys.executable).parent
    env = _env(RECSCALE_JOB_SECRET=None)  # the README's way: the secret in a file
    made = subprocess.run([str(bin_dir / "recscale"), "secret", "--out", "conf/local/job.secret"],
                          cwd=proj, env=env, capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    secret = (proj / "conf" / "local" / "job.secret").read_text().strip()
    copy = tmp_path / "host1.secret"  # the copy the other host holds
    copy.write_text(secret + "\n")
    copy.chmod(0o600)
    params = ",".join([f"train.launch.rdzv_endpoint={ep}", "train.launch.world_size=4",
                       "sharding.topology=cpu-local", "sharding.local_world_size=2",
                       "train.launch.rdzv_timeout_s=120"])
    driver = hosts[0].popen([str(bin_dir / "kedro"), "run", "--pipeline=dlrm", "--env=cluster",
                             "--params", params], env=env, cwd=proj, **KW)
    elsewhere = tmp_path / "elsewhere"  # the other host needs no project, no config
    elsewhere.mkdir()
    joiner = hosts[1].popen([str(bin_dir / "recscale"), "join", "--endpoint", ep,
                             "--secret-file", str(copy)], env=env, cwd=elsewhere, **KW)
    rc, out = wait(driver, "kedro run on the driver", timeout=400)
    assert rc == 0, out[-6000:]
    jrc, jout = wait(joiner, "recscale join", timeout=60)
    assert jrc == 0, jout[-3000:]
    assert "the job finished" in jout and "this host ran ranks [2, 3]" in jout

    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{proj}/mlruns/mlflow.db")
    runs = mlflow.search_runs(experiment_names=["recscale"])
    assert len(runs) == 1  # one job, one run: the other host records nothing
    run = runs.iloc[0]
    assert run["params.train.launch.world_size"] == "4" and run["tags.kedro.env"] == "cluster"
    assert run["metrics.train.world_size"] == 4 and run["metrics.train.attempts"] == 1
    assert run["metrics.train.replans"] == 0
    for side in ("intra_host", "inter_host"):  # measured and the planner's estimate, per step
        assert run[f"metrics.train.bytes_per_step.embedding.{side}"] > 0
        assert run[f"metrics.train.bytes_per_step.embedding.{side}.estimate"] > 0
    assert 0.6 < run["metrics.test.auc"]
    assert not list((elsewhere).iterdir()), "the joining host wrote into its working directory"
    # the secret in no log line, param, tag or artifact of the run
    assert "signed with the secret from conf/local/job.secret" in out
    assert secret not in out and secret not in jout
    assert not [k for k, v in run.items() if secret in str(v)]
    client = mlflow.MlflowClient()
    art = Path(client.download_artifacts(run["run_id"], "", str(tmp_path / "artifacts")))
    leaked = [f for f in art.rglob("*") if f.is_file() and secret.encode() in f.read_bytes()]
    assert not leaked, leaked


def test_recscale_join_needs_an_endpoint():
    res = subprocess.run([sys.executable, "-m", "recscale", "join", "--endpoint", "nohost"],
                         capture_output=True, text=True, timeout=60, env=_env())
    assert res.returncode == 2 and "--endpoint='nohost' is not allowed: expected host:port" \
        in res.stderr


def test_the_nightly_retrain_runs_one_night_on_two_hosts(netns_hosts, tmp_path):
    """The nightly retrain as the dlrm job above: the driver runs it with --env=cluster, the
    other host joins; the night is trained on 4 ranks over both hosts, registered once and
    consumed once, in one MLflow run."""
    import json

    from tests.e2e.test_daily_use import NIGHTLY, _params, _write_day

    hosts = netns_hosts(2)
    proj = make_project_copy(tmp_path, base_sizes_from="test")
    _write_day(proj, 1, 6000, 3)
    ep = f"{hosts[0].addr}:29400"
    bin_dir = Path(sys.executable).parent
    env = _env(RECSCALE_JOB_SECRET=None)
    made = subprocess.run([str(bin_dir / "recscale"), "secret", "--out", "conf/local/job.secret"],
                          cwd=proj, env=env, capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    params = ",".join([f"train.launch.rdzv_endpoint={ep}", "train.launch.world_size=4",
                       "sharding.topology=cpu-local", "sharding.local_world_size=2",
                       "train.launch.rdzv_timeout_s=120"])
    driver = hosts[0].popen([str(bin_dir / "kedro"), "run", "--config", NIGHTLY,
                             "--env=cluster", "--params", params], env=env, cwd=proj, **KW)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    joiner = hosts[1].popen([str(bin_dir / "recscale"), "join", "--endpoint", ep,
                             "--secret-file", str(proj / "conf" / "local" / "job.secret")],
                            env=env, cwd=elsewhere, **KW)
    rc, out = wait(driver, "the nightly retrain on the driver", timeout=400)
    assert rc == 0, out[-6000:]
    jrc, jout = wait(joiner, "recscale join", timeout=60)
    assert jrc == 0 and "this host ran ranks [2, 3]" in jout, jout[-3000:]

    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{proj}/mlruns/mlflow.db")
    mlflow.set_registry_uri(f"sqlite:///{proj}/mlruns/mlflow.db")
    runs = mlflow.search_runs(experiment_names=["recscale"])
    assert len(runs) == 1
    run = runs.iloc[0]
    assert run["metrics.train.world_size"] == 4 and run["metrics.sharding.world_size"] == 4
    versions = mlflow.MlflowClient().search_model_versions(
        f"name = '{_params(proj, 'retrain')['retrain']['registered_model']}'")
    assert [int(v.version) for v in versions] == [1] and versions[0].run_id == run["run_id"]
    ledger = json.loads((proj / _params(proj, "retrain")["retrain"]["ledger"]).read_text())
    assert [e["partition"] for e in ledger["consumed"]] == ["day_01.tsv"]
    assert ledger["consumed"][0]["run_id"] == run["run_id"]
