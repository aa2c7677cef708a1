"""`kedro run --params` as a user types it: a host range ``2:3`` reaches ``train.launch.nnodes``
as the string "2:3" (Kedro parses --params values as YAML 1.1, where it is the base-60 integer
123; the project's own run command, recscale/cli.py, keeps it as typed), a list keeps its commas,
and a misspelt block stops the run."""

import pytest

from tests.e2e.project import kedro, make_project_copy

pytestmark = pytest.mark.e2e


def _params_of_the_run(proj) -> dict:
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{proj}/mlruns/mlflow.db")
    runs = mlflow.search_runs(experiment_names=["recscale"])
    assert len(runs) == 1
    return {k[len("params."):]: v for k, v in runs.iloc[0].items() if k.startswith("params.")}


def test_a_host_range_typed_in_params_arrives_as_the_range(tmp_path):
    proj = make_project_copy(tmp_path)
    # the config node alone: the range parsed, a job across hosts configured, nothing trained
    job = ("train.launch.nnodes=2:3,train.launch.world_size=3,train.launch.max_restarts=1,"
           f"train.checkpoint.dir={tmp_path / 'ckpt'},preprocess.splits=[0.5,0.25,0.25]")
    res = kedro(proj, "run", "--pipeline=dlrm", "--env=test", "--to-nodes=parse_dlrm_config",
                f"--params={job}")
    assert "Pipeline execution completed successfully" in res.stderr + res.stdout
    params = _params_of_the_run(proj)
    assert params["train.launch.nnodes"] == "2:3" and params["train.launch.world_size"] == "3"
    assert params["preprocess.splits"] == "[0.5, 0.25, 0.25]"  # a list, its commas kept
    # and the check that names the key sees the range, not 123
    res = kedro(proj, "run", "--pipeline=dlrm", "--env=test", "--to-nodes=parse_dlrm_config",
                "--params=train.launch.nnodes=2:3", check=False)
    assert res.returncode != 0
    assert ("train.launch.nnodes='2:3' is not allowed: expected a divisor of "
            "train.launch.world_size=1") in res.stderr, res.stderr[-3000:]


def test_a_misspelt_block_in_params_or_in_an_env_stops_the_run_naming_it(tmp_path):
    proj = make_project_copy(tmp_path)
    res = kedro(proj, "run", "--pipeline=dlrm", "--env=test", "--to-nodes=parse_dlrm_config",
                "--params=trian.epochs=2", check=False)
    assert res.returncode != 0
    assert ("unknown parameter block 'trian' (did you mean 'train'?) in the parameters of env "
            "'test' and --params") in res.stderr, res.stderr[-3000:]
    # a block misspelt in a config env's file, beside the right ones
    (proj / "conf" / "typo").mkdir()
    (proj / "conf" / "typo" / "parameters_dlrm.yml").write_text(
        "train:\n  epochs: 1\nevalute:\n  batch_size: 1024\n")
    res = kedro(proj, "run", "--pipeline=dlrm", "--env=typo", "--to-nodes=parse_dlrm_config",
                check=False)
    assert res.returncode != 0
    assert "unknown parameter block 'evalute' (did you mean 'evaluate'?)" in res.stderr, \
        res.stderr[-3000:]
    assert "Running node" not in res.stderr + res.stdout  # stopped before any node


def test_a_kedro_command_forked_by_the_tests_prints_and_ends_as_a_fresh_kedro(tmp_path,
                                                                                 monkeypatch):
    """The end-to-end tests fork their `kedro` commands from one process that has imported Kedro,
    MLflow, torch and the pipelines (tests/e2e/kedro_zygote.py): a command must print what a
    fresh `kedro` prints (the copy's conf/logging.yml format, the error) and end with its status."""
    import re

    proj = make_project_copy(tmp_path)
    args = ("run", "--pipeline=dlrm", "--env=test", "--params=trian.epochs=2")
    ok = ("run", "--pipeline=dlrm", "--env=test", "--to-nodes=parse_dlrm_config")
    forked = [kedro(proj, *args, check=False), kedro(proj, *ok)]
    monkeypatch.setenv("RECSCALE_TEST_KEDRO_FORK", "0")
    fresh = [kedro(proj, *args, check=False), kedro(proj, *ok)]

    def lines(text):  # timestamps, the run's own ids and a traceback's frames aside (the
        # forked command's outermost frames are the fork server's, not the `kedro` script's)
        text = re.sub(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+", "T", text)
        text = re.sub(r"\S*/site-packages/", "", text)  # a venv reached through a link or not
        text = re.sub(r"\d+\.\d+ sec", "N sec", text)  # the run's own time
        return [x for x in re.sub(r"[0-9a-f]{32}", "ID", text).splitlines()
                if not x.startswith(" ")]

    for a, b in zip(forked, fresh):
        assert a.returncode == b.returncode
        assert lines(a.stdout) == lines(b.stdout)
        assert lines(a.stderr) == lines(b.stderr)
    assert forked[0].returncode != 0 and "unknown parameter block 'trian'" in forked[0].stderr
    assert re.search(r"^\d{4}-\S+ \S+ INFO kedro", forked[1].stderr, re.M), forked[1].stderr[-2000:]
