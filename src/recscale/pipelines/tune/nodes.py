"""Thin tuning node: the ``tune`` block and the DLRM parameters in, a study run through the
library (``recscale.tune``), each trial a nested MLflow run under the pipeline's run, the study's
metrics, table and plots and the best trial's config env out."""

from __future__ import annotations

import datetime
import fcntl
import hashlib
import json
import logging
import re
from pathlib import Path

import mlflow
import numpy as np

from recscale.config import ConfigError, parse
from recscale.data.preprocess import load_manifest
from recscale.pipelines.common import DLRM_BLOCKS, as_metrics
from recscale.pipelines.data_processing.nodes import preprocess
from recscale.runconfig import DLRMConfig
from recscale.tune import (
    TrialOutcome,
    TuneConfig,
    apply,
    best_values,
    check_space,
    figures,
    parse_space,
    run_study,
    run_trial,
    trials_table,
    write_env,
)

log = logging.getLogger(__name__)
# what a trial changes for itself: its progress bar is the study's, and the best step it returns
# is kept in memory (no checkpoint of one trial is resumed by the next)
TRIAL_SETTINGS = {"train.progress": "off", "train.checkpoint.dir": None}


def _parse(params: dict) -> DLRMConfig:
    return parse(DLRMConfig, params, "")


def _data_key(params: dict) -> str:
    """What preprocessing depends on beyond the raw rows (``features``, ``preprocess`` but its
    output folder), hashed: trials with equal keys share one preprocessed copy."""
    pre = {k: v for k, v in (params.get("preprocess") or {}).items() if k != "output_dir"}
    blob = json.dumps({"features": params.get("features"), "preprocess": pre}, sort_keys=True,
                      default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


class DataCache:
    """The dataset each trial trains on: the pipeline's own when the trial leaves preprocessing
    alone, else one preprocessed copy per value of the preprocessing keys, under ``root``."""

    def __init__(self, raw_manifest: dict, manifest: dict, base: dict, root: str):
        self.raw, self.manifest, self.root = raw_manifest, manifest, Path(root)
        self.base_key = _data_key(base)

    def params_for(self, params: dict) -> dict:
        key = _data_key(params)
        if key == self.base_key:
            return params
        return apply(params, {"preprocess.output_dir": str(self.root / key)})

    def manifest_for(self, params: dict, cfg: DLRMConfig) -> dict:
        if _data_key(params) == self.base_key:
            return self.manifest
        out = Path(cfg.preprocess.output_dir)
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(str(out) + ".lock", "w") as lock:  # processes sharing the study wait here
            fcntl.flock(lock, fcntl.LOCK_EX)
            if (out / "_manifest.json").exists():
                return {"manifest_path": str(out / "_manifest.json"), **load_manifest(out)}
            log.info("preprocessing for this trial's features/preprocess keys into %s", out)
            return preprocess(self.raw, cfg)[0]


def _mlflow_key(key: str) -> str:
    """``features.tables[items].dim`` -> ``features.tables.items.dim`` (MLflow's key alphabet)."""
    return re.sub(r"\[([^\]]+)\]", r".\1", key)


def _log_trial(out: TrialOutcome) -> None:
    for name, points in out.history.items():
        if name.startswith("validation.") or name == "loss":
            for p in points:
                mlflow.log_metric(name if name.startswith("validation.") else f"train.{name}",
                                  float(p["value"]), step=int(p["step"]))
    flat = {"steps": out.steps, "seconds": out.seconds, "best_step": out.best_step,
            "pruned_at_step": out.pruned_at,
            **{f"final.validation.{k}": v for k, v in out.validation.items()},
            **{f"test.{k}": v for k, v in out.test.items()}}
    mlflow.log_metrics({k: float(v) for k, v in flat.items()
                        if v is not None and np.isfinite(float(v))})
    mlflow.set_tag("recscale.tune.state", "PRUNED" if out.pruned_at else "COMPLETE")


def check_study(parameters: dict):
    """The ``tune`` block and its space against the run's DLRM parameters, before any work (the
    project's hook calls it when a run holds the tune node): -> (TuneConfig, the space, the DLRM
    blocks, their typed config)."""
    cfg = parse(TuneConfig, parameters.get("tune") or {}, "tune")
    space = parse_space(cfg.space)
    base = {b: parameters[b] for b in DLRM_BLOCKS if b in parameters}
    check_space(space, apply(base, TRIAL_SETTINGS), _parse)
    run_cfg = _parse(base)
    if not run_cfg.train.validation.enabled:
        raise ConfigError("train.validation.enabled=false is not allowed for tuning: the pruner "
                          "and each trial's value read the validation split (set it true)")
    return cfg, space, base, run_cfg


def tune_dlrm(dataset_manifest: dict, raw_manifest: dict, parameters: dict, tune_params: dict,
              run_env: str = "local"):
    """-> the study's metrics, its table (every trial), its plots and the best trial's record;
    the best trial's parameters are written to ``conf/<tune.best_env>/``."""
    cfg, space, base, run_cfg = check_study({**parameters, "tune": tune_params})
    trial_base = apply(base, TRIAL_SETTINGS)
    oracle = (np.load(raw_manifest["oracle_path"], mmap_mode="r")
              if "oracle_path" in raw_manifest else None)
    storage = cfg.storage_url(".")
    cache = DataCache(raw_manifest, dataset_manifest, trial_base,
                      f"data/05_model_input/tune/{cfg.study}")

    def run_one(number: int, values: dict, observer) -> TrialOutcome:
        params = cache.params_for(apply(trial_base, values))
        tcfg = _parse(params)
        with mlflow.start_run(run_name=f"{cfg.study} trial {number}", nested=True):
            mlflow.set_tags({"recscale.tune.study": cfg.study, "recscale.tune.trial": number})
            mlflow.log_params({_mlflow_key(k): v for k, v in values.items()})
            try:
                out = run_trial(tcfg, cache.manifest_for(params, tcfg), cfg.metric, observer,
                                oracle, cfg.test)
            except Exception as exc:
                mlflow.set_tags({"recscale.tune.state": "FAIL",
                                 "recscale.tune.fail_reason": f"{type(exc).__name__}: {exc}"[:5000]})
                raise
            _log_trial(out)
        return out

    result = run_study(cfg, space, run_one, storage, progress=run_cfg.train.progress)
    study = result.study
    table = trials_table(study)
    states = table["state"].value_counts().to_dict() if len(table) else {}
    values = best_values(study, space)
    best = study.best_trial
    test = {k.removeprefix("test_"): v for k, v in best.user_attrs.items() if k.startswith("test_")}
    header = (f"The best trial of tune.study {cfg.study!r} ({storage}): trial {best.number}, "
              f"validation {cfg.metric} {best.value:.4f}"
              + (f", test auc {test['auc']:.4f}" if "auc" in test else "") + ".\n"
              f"Written by `kedro run --pipelines=tune --env={run_env}` on "
              f"{datetime.date.today().isoformat()}; every DLRM key resolved, the searched ones:\n"
              + "\n".join(f"  {k}: {json.dumps(v)}" for k, v in values.items())
              + f"\nRun it: kedro run --pipelines=dlrm --env={cfg.env_name}")
    env = write_env("conf", cfg.env_name, base, values, header, run_env)
    log.info("study %r: %d trial(s) here in %.0f s; %s. Best: trial %d, validation %s %.4f%s. "
             "Its config: %s (kedro run --pipelines=dlrm --env=%s)", cfg.study, result.ran,
             result.seconds, ", ".join(f"{n} {s.lower()}" for s, n in sorted(states.items())),
             best.number, cfg.metric, best.value,
             "".join(f", test {k} {test[k]:.4f}" for k in ("auc", "oracle_auc") if k in test),
             env, cfg.env_name)
    metrics = {"trials": len(table), "trials_run": result.ran, "seconds": result.seconds,
               **{f"trials_{s.lower()}": n for s, n in states.items()},
               "best.trial": best.number, f"best.validation_{cfg.metric}": best.value,
               **{f"best.test_{k}": v for k, v in test.items()}}
    record = {"study": cfg.study, "storage": storage, "metric": cfg.metric,
              "trial": best.number, "value": best.value, "params": values,
              "test": test, "env": str(env), "user_attrs": dict(best.user_attrs)}
    mlflow.log_params({f"tune.best.{_mlflow_key(k)}": v for k, v in values.items()})
    return as_metrics(metrics), table, figures(study), record
