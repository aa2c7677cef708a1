"""Daily use, end to end in a scratch copy of the project (conf/test sizes merged into its base):
a sweep over two config environments, the nightly retrain on day 1, day 2, a night without new
data and a day the champion wins, then the MLflow UI (mlflow server + headless Chromium) showing
the runs and their metrics."""

import json
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.conftest import PROJECT_ROOT
from tests.e2e.project import kedro, make_project_copy

pytestmark = pytest.mark.e2e

SWEEPS = ("optimizer_lr02", "sharding_greedy")  # two envs: sweep_optimizer, sweep_sharding
NIGHTLY = "pipelines/retrain_nightly.yml"


def _params(proj, name):
    return yaml.safe_load((proj / "conf" / "base" / f"parameters_{name}.yml").read_text())


def _write_day(proj, day: int, rows: int, seed: int) -> Path:
    from recscale.config import parse
    from recscale.data.synthetic import SyntheticConfig, generate_criteo_tsv

    syn = dict(_params(proj, "dlrm")["data"]["synthetic"], num_rows=rows, seed=seed)
    landing = proj / _params(proj, "retrain")["retrain"]["landing_dir"]
    out = landing / f"day_{day:02d}.tsv"
    generate_criteo_tsv(parse(SyntheticConfig, syn, "data.synthetic"), out, day=day)
    return out


def _client(proj):
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{proj}/mlruns/mlflow.db")
    mlflow.set_registry_uri(f"sqlite:///{proj}/mlruns/mlflow.db")
    return mlflow.MlflowClient()


def _state(proj, model):
    """Everything a retrain may change: versions (with tags), alias, ledger bytes, model file."""
    c = _client(proj)
    versions = sorted(((int(v.version), dict(v.tags)) for v in
                       c.search_model_versions(f"name = '{model}'")), key=lambda x: x[0])
    try:
        alias = int(c.get_model_version_by_alias(model, "champion").version)
    except Exception:
        alias = None
    r = _params(proj, "retrain")["retrain"]
    ledger, latest = proj / r["ledger"], proj / r["model_dir"] / "latest.pt"
    return {"versions": versions, "alias": alias,
            "ledger": ledger.read_bytes() if ledger.exists() else None,
            "latest": (latest.stat().st_mtime_ns, latest.read_bytes()) if latest.exists() else None}


@pytest.fixture(scope="session")  # made once, whatever runs between this file's tests
def daily(tmp_path_factory, test_seed):
    proj = make_project_copy(tmp_path_factory.mktemp("daily"), base_sizes_from="test")
    rng = random.Random(test_seed)
    out = {"proj": proj, "sweeps": {}, "retrain": []}
    for s in SWEEPS:
        kedro(proj, "run", "--config", f"pipelines/sweeps/{s}.yml")
    model = _params(proj, "retrain")["retrain"]["registered_model"]
    seed, rows = rng.randrange(1000), rng.randrange(5000, 8000)
    out["model"] = model
    for day in (1, 2):
        _write_day(proj, day, rows, seed)
        res = kedro(proj, "run", "--config", NIGHTLY)
        out["retrain"].append((res, _state(proj, model)))
    res = kedro(proj, "run", "--config", NIGHTLY)  # no new day
    out["rerun"] = (res, _state(proj, model))
    _write_day(proj, 3, rows, seed)  # a champion that cannot be beaten: gain of 1 AUC required
    res = kedro(proj, "run", "--config", NIGHTLY, "--params=retrain.min_auc_gain=1.0")
    out["refused"] = (res, _state(proj, model))
    return out


def test_sweep_over_two_envs_gives_two_runs_with_their_env_and_params(daily):
    proj = daily["proj"]
    c = _client(proj)
    import mlflow

    runs = mlflow.search_runs(experiment_names=["recscale"],
                              filter_string="tags.`kedro.pipeline` = 'dlrm'")
    assert len(runs) == len(SWEEPS)
    by_env = {r["tags.kedro.env"]: r for _, r in runs.iterrows()}
    from recscale.config import flatten

    for s in SWEEPS:
        cfg = yaml.safe_load((proj / "pipelines" / "sweeps" / f"{s}.yml").read_text())["run"]
        env_file = yaml.safe_load((proj / "conf" / cfg["env"] / "parameters_dlrm.yml").read_text())
        run = by_env[cfg["env"]]
        swept = flatten(cfg["params"])
        for k, v in {**flatten(env_file), **swept}.items():  # the env's settings, the swept value
            assert run[f"params.{k}"] == str(v), k
        given = ",".join(f"{k}={v}" for k, v in sorted(swept.items()))
        assert run["tags.kedro.runtime_params"] == given
        assert run["tags.mlflow.runName"] == f"dlrm @ {cfg['env']} {given}"
        assert run["metrics.test.auc"] > 0.5
        arts = {a.path for d in ("plots/training", "plots/evaluation")
                for a in c.list_artifacts(run["run_id"], d)}
        assert arts == {"plots/training/loss.png", "plots/training/throughput.png",
                        "plots/evaluation/roc.png", "plots/evaluation/calibration.png"}
    a, b = (by_env[yaml.safe_load((proj / "pipelines/sweeps" / f"{s}.yml").read_text())["run"]["env"]]
            for s in SWEEPS)
    differ = [c for c in runs.columns if c.startswith("params.") and a[c] != b[c]]
    assert differ, "two sweep envs logged identical parameters"


def test_retrain_day1_then_day2_registers_two_versions_and_champion_follows_the_rule(daily):
    (res1, s1), (res2, s2) = daily["retrain"]
    assert [v for v, _ in s1["versions"]] == [1] and s1["alias"] == 1  # first model: champion
    assert "no champion yet" in res1.stderr
    assert [v for v, _ in s2["versions"]] == [1, 2]
    tags = s2["versions"][1][1]
    new, champ = float(tags["retrain.auc"]), float(tags["retrain.champion_auc"])
    assert tags["retrain.champion_version"] == "1"
    assert tags["retrain.eval_data"].endswith("of day_02.tsv")  # both scored on the newest day
    assert s2["alias"] == (2 if new >= champ else 1)
    assert tags["retrain.promoted"] == str(new >= champ).lower()
    # day 2 continued from day 1's checkpoint: its weights and optimizer state
    assert "warm start from checkpoint" in res2.stderr
    assert "initialised from checkpoint" in res2.stderr
    ledger = json.loads(s2["ledger"])
    assert [e["partition"] for e in ledger["consumed"]] == ["day_01.tsv", "day_02.tsv"]
    assert [e["model_version"] for e in ledger["consumed"]] == [1, 2]
    c = _client(daily["proj"])
    run = c.get_run(ledger["consumed"][1]["run_id"])
    assert run.data.tags["retrain.outcome"] == ("promoted" if new >= champ else "not_promoted")
    assert run.data.metrics["retrain.challenger.auc"] == pytest.approx(new, abs=1e-6)
    assert {a.path for a in c.list_artifacts(run.info.run_id, "plots")} >= {
        "plots/loss.png", "plots/throughput.png", "plots/roc.png", "plots/calibration.png",
        "plots/auc_history.png"}
    # the night's sharding plan, planned and logged as a dlrm run's
    assert {a.path for a in c.list_artifacts(run.info.run_id, "sharding")} == {
        "sharding/sharding_plan.json", "sharding/sharding_report.txt",
        "sharding/sharding_plan.png"}
    assert run.data.metrics["sharding.world_size"] == 1


def test_the_registered_champion_predicts_what_the_evaluation_scores(daily, monkeypatch):
    """The registered pyfunc (models from code) loads by its alias and scores the RAW lines of
    the last night's held-out rows exactly as the evaluation path scores their preprocessed
    rows (``score_split`` on the same split: row for row), and their AUC is the champion AUC
    that night's retrain recorded."""
    import mlflow

    from recscale.data.preprocess import load_manifest
    from recscale.evaluate import auc_score
    from recscale.model import model_from_resolved
    from recscale.pipelines.retrain.registry import load_version
    from recscale.scoring import score_split
    from tests.conftest import criteo_frame

    proj = daily["proj"]
    c = _client(proj)
    model = mlflow.pyfunc.load_model(f"models:/{daily['model']}@champion")
    work = proj / _params(proj, "retrain")["retrain"]["work_dir"]
    monkeypatch.chdir(proj)  # the manifest names its files as the run saw them, from the project
    man = load_manifest(work)
    ws = load_version(daily["model"], c.get_model_version_by_alias(daily["model"], "champion"))
    evaluated = score_split(model_from_resolved(ws.config, ws.state), man, "test", 4096)
    frame = criteo_frame(man["source_files"], evaluated.rows)
    out = model.predict(frame.drop(columns=["label"]))
    assert len(out) == len(frame) > 0 and out["error"].isna().all()
    assert np.array_equal(out["row"].to_numpy(), evaluated.rows)
    probs = out["probability"].to_numpy(float)
    np.testing.assert_allclose(probs, evaluated.probs, rtol=0, atol=1e-6)
    # the last night (day 3) kept the champion and scored it on these rows
    _, refused = daily["refused"]
    tags = refused["versions"][-1][1]
    assert tags["retrain.champion_version"] == str(refused["alias"])
    assert auc_score(frame["label"].to_numpy(), probs) == pytest.approx(
        float(tags["retrain.champion_auc"]), abs=1e-6)


def test_rerun_without_new_data_changes_nothing(daily):
    _, before = daily["retrain"][1]
    res, after = daily["rerun"]
    assert after == before
    assert "no new partitions" in res.stderr and "nothing to do" in res.stderr


def test_challenger_below_the_champion_is_registered_but_not_promoted_and_says_why(daily):
    _, before = daily["rerun"]
    res, after = daily["refused"]
    assert [v for v, _ in after["versions"]] == [1, 2, 3]
    assert after["alias"] == before["alias"]
    tags = after["versions"][2][1]
    assert tags["retrain.promoted"] == "false"
    assert "champion kept" in res.stderr
    # the rule as it was applied: the challenger's AUC below the champion's + the gain asked
    new, champ = float(tags["retrain.auc"]), float(tags["retrain.champion_auc"])
    said = re.fullmatch(r"challenger AUC (\d\.\d{4}) < champion AUC (\d\.\d{4}) \+ 1 on .+: "
                        r"champion kept", tags["retrain.reason"])
    assert said, tags["retrain.reason"]
    assert float(said[1]) == pytest.approx(new, abs=6e-5)
    assert float(said[2]) == pytest.approx(champ, abs=6e-5)


# ---------------------------------------------------------------------------------- the UI
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _chromium() -> tuple[str, str]:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver") or ("/usr/bin/chromedriver"
                                              if Path("/usr/bin/chromedriver").exists() else None)
    if not browser or not driver:
        why = ("headless Chromium is needed for the MLflow UI test: install the Debian packages "
               "with `apt-get install -y chromium chromium-driver` (make test does where it can)")
        if os.environ.get("RECSCALE_REQUIRE_SYSTEM_PACKAGES") == "1":  # CI can install them
            pytest.fail(why)
        pytest.skip(why)
    return browser, driver


def test_mlflow_ui_shows_the_runs_and_their_metrics(daily, tmp_path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.support.ui import WebDriverWait

    browser, driver_path = _chromium()
    proj = daily["proj"]
    import mlflow

    _client(proj)
    exp = mlflow.get_experiment_by_name("recscale").experiment_id
    runs = mlflow.search_runs([exp], filter_string="tags.`kedro.pipeline` = 'dlrm'")
    port = _free_port()
    log = open(tmp_path / "mlflow_server.log", "w")
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "mlflow"), "server", "--host", "127.0.0.1",
         "--port", str(port), "--workers", "1",
         "--backend-store-uri", f"sqlite:///{proj}/mlruns/mlflow.db",
         "--default-artifact-root", str(proj / "mlruns" / "artifacts")],
        cwd=proj, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, DO_NOT_TRACK="true"))
    driver = None
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                if urllib.request.urlopen(f"{base}/health", timeout=2).read().strip() == b"OK":
                    break
            except OSError:
                pass
            assert server.poll() is None, (tmp_path / "mlflow_server.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "mlflow server did not answer within 90 s"
            time.sleep(0.3)
        opts = webdriver.ChromeOptions()
        opts.binary_location = browser
        for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                  "--window-size=1500,900"):
            opts.add_argument(a)
        driver = webdriver.Chrome(service=Service(driver_path), options=opts)
        wait = WebDriverWait(driver, 60, poll_frequency=0.3)

        def body():
            return driver.find_element("tag name", "body").text

        names = list(runs["tags.mlflow.runName"])
        # the experiment's runs (MLflow 3 opens experiments in its GenAI view unless asked)
        driver.get(f"{base}/#/experiments/{exp}/runs?workflowType=machine_learning"
                   "&compareRunsMode=CHART")
        wait.until(lambda d: all(n in body() for n in names))
        _best_effort_tidy(driver)
        shots = PROJECT_ROOT / "benchmarks" / "out"
        shots.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(shots / "mlflow_ui_runs.png"))
        # side by side: every run's parameters and metrics
        ids = json.dumps(list(runs["run_id"]), separators=(",", ":"))
        driver.get(f"{base}/#/compare-runs?runs={ids}&experiments=[\"{exp}\"]")
        wait.until(lambda d: all(n in body() for n in names))
        shown = wait.until(lambda d: _metric_row(d, "test.auc"))
        assert shown == [f"{round(v, 3):g}" for v in runs["metrics.test.auc"]], shown
        driver.save_screenshot(str(shots / "mlflow_ui_compare.png"))
        shutil.copy(shots / "mlflow_ui_runs.png", tmp_path / "mlflow_ui_runs.png")
        if os.environ.get("RECSCALE_UPDATE_DOC_SCREENSHOT"):
            (PROJECT_ROOT / "docs" / "img").mkdir(parents=True, exist_ok=True)
            shutil.copy(shots / "mlflow_ui_runs.png", PROJECT_ROOT / "docs/img/mlflow_ui_runs.png")
    finally:
        if driver is not None:
            driver.quit()
        server.terminate()
        try:
            server.wait(15)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


def _metric_row(driver, name: str) -> list[str] | None:
    """The values the compare page shows for metric ``name``, one per run column (None while
    the page is still rendering). Names and values are two virtualized grids: a value cell sits
    at the same ``top`` as its name cell."""
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.common.by import By

    try:
        label = driver.find_elements(By.XPATH, f"//*[normalize-space(text())='{name}']")
        if not label:
            return None
        driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", label[0])
        cell = label[0].find_element(By.XPATH, "./ancestor::div[contains(@style, 'top:')][1]")
        top = cell.value_of_css_property("top")
        box = cell.find_element(By.XPATH, "./ancestor::div[contains(@class, 'collapse-content-box')][1]")
        grids = box.find_elements(By.CLASS_NAME, "ReactVirtualized__Grid__innerScrollContainer")
        cells = [c for c in grids[-1].find_elements(By.XPATH, "./*")
                 if c.value_of_css_property("top") == top]
        cells.sort(key=lambda c: float(c.value_of_css_property("left").removesuffix("px")))
        values = [c.get_attribute("textContent").strip() for c in cells]
        return values if values and all(values) else None
    except WebDriverException:
        return None


def _best_effort_tidy(driver) -> None:
    """Close the assistant side panel and show the test.* charts first (cosmetic only)."""
    from selenium.webdriver.common.by import By

    for el in driver.find_elements(By.CSS_SELECTOR, "button[aria-label*='lose']"):
        try:
            el.click()
        except Exception:
            pass
    for el in driver.find_elements(By.CSS_SELECTOR, "input[placeholder*='earch']"):
        if "chart" in (el.get_attribute("placeholder") or "").lower():
            el.send_keys("test.")
    time.sleep(1.5)
