"""A study over a DLRM config with Optuna: the TPE sampler, a pruner fed by the validation points
of each trial's training, the study in an Optuna storage (a SQLite file by default: the same
command resumes it; a database URL lets several processes or hosts run trials of one study), and
the best trial's parameters as a config env (``write_env``).

Trials that fail (a refused combination, out of memory) are recorded as failed with their reason
(``fail_reason``) and the study goes on; Ctrl-C marks the running trial failed without a reason,
and a resumed study runs it again (``tune.trials`` counts finished and running trials, and failed
ones with a reason).
"""

from __future__ import annotations

import logging
import math
import shutil
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import yaml

from recscale.progress import Progress
from recscale.tune.config import TuneConfig
from recscale.tune.space import Param, apply
from recscale.tune.trial import TrialOutcome

log = logging.getLogger(__name__)
optuna.logging.set_verbosity(optuna.logging.WARNING)  # one line per trial is ours (below)

FAIL_REASON = "fail_reason"


def make_pruner(cfg: TuneConfig) -> optuna.pruners.BasePruner:
    """``tune.pruner``; the steps it sees are a trial's validation points (1, 2, ...), so trials of
    other batch sizes are compared point for point."""
    if cfg.pruner == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=cfg.startup_trials,
                                           n_warmup_steps=cfg.min_points)
    if cfg.pruner == "halving":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=cfg.min_points)
    return optuna.pruners.NopPruner()


def _storage(url: str) -> optuna.storages.RDBStorage:
    """``tune.storage_url`` (a database URL, validated by ``TuneConfig``) as Optuna's storage."""
    if url.startswith("sqlite:///"):
        path = Path(url[len("sqlite:///"):])
        path.parent.mkdir(parents=True, exist_ok=True)
        # processes sharing one file wait for its lock instead of failing at once
        return optuna.storages.RDBStorage(url, engine_kwargs={"connect_args": {"timeout": 60}})
    return optuna.storages.RDBStorage(url)


def open_study(cfg: TuneConfig, storage: str) -> optuna.Study:
    """The study named ``tune.study`` in ``storage``, created or (the same name) resumed."""
    sampler = optuna.samplers.TPESampler(seed=cfg.seed, n_startup_trials=cfg.startup_trials)
    study = optuna.create_study(study_name=cfg.study, storage=_storage(storage), sampler=sampler,
                                pruner=make_pruner(cfg), load_if_exists=True,
                                direction="maximize" if cfg.maximize else "minimize")
    if study.user_attrs.get("metric", cfg.metric) != cfg.metric:
        raise ValueError(f"study {cfg.study!r} in {storage} optimises validation "
                         f"{study.user_attrs['metric']}, not tune.metric={cfg.metric!r}: name "
                         "another tune.study")
    study.set_user_attr("metric", cfg.metric)
    return study


class TrialObserver:
    """The validation points of one trial's training, reported to its Optuna trial; True when the
    pruner says stop. Pickles (without the trial) into a sharded run's rank 0, which reloads the
    trial from the storage."""

    def __init__(self, trial: optuna.Trial, cfg: TuneConfig, storage: str):
        self.cfg, self.storage, self.number = cfg, storage, trial.number
        self._trial: optuna.Trial | None = trial
        self.points = 0
        self.pruned_at_point = 0

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_trial": None}

    def trial(self) -> optuna.Trial:
        if self._trial is None:
            storage = _storage(self.storage)
            study = optuna.load_study(study_name=self.cfg.study, storage=storage,
                                      pruner=make_pruner(self.cfg))
            trial_id = storage.get_trial_id_from_study_id_trial_number(
                storage.get_study_id_from_name(self.cfg.study), self.number)
            self._trial = optuna.trial.Trial(study, trial_id)
        return self._trial

    def __call__(self, step: int, metrics: Mapping[str, float]) -> bool:
        self.points += 1
        value = float(metrics[self.cfg.metric])
        if not math.isfinite(value):
            return False
        trial = self.trial()
        trial.report(value, self.points)
        if trial.should_prune():
            self.pruned_at_point = self.points
            return True
        return False


def counted(study: optuna.Study) -> int:
    """Trials that count towards ``tune.trials``: finished, running, failed with a reason."""
    S = optuna.trial.TrialState
    return sum(1 for t in study.get_trials(deepcopy=False)
               if t.state in (S.COMPLETE, S.PRUNED, S.RUNNING)
               or (t.state == S.FAIL and FAIL_REASON in t.user_attrs))


RunOne = Callable[[int, dict[str, Any], TrialObserver], TrialOutcome]


@dataclass
class StudyResult:
    study: optuna.Study
    ran: int  # trials this command ran
    seconds: float


def run_study(cfg: TuneConfig, space: list[Param], run_one: RunOne, storage: str,
              progress: str = "auto") -> StudyResult:
    """Run the study's trials until ``tune.trials`` count (``counted``) or ``tune.timeout_s``
    passed; ``run_one(number, values, observer)`` trains one trial's config (the keys of
    ``space`` set to ``values``) and returns its outcome."""
    study = open_study(cfg, storage)
    todo = cfg.trials - counted(study)
    start = time.perf_counter()
    if todo <= 0:
        log.info("study %r already holds %d trials (tune.trials=%d): nothing to run",
                 cfg.study, counted(study), cfg.trials)
        return StudyResult(study, 0, 0.0)
    log.info("study %r in %s: %d trial(s) to run (%d of %d there), validation %s, %s pruner",
             cfg.study, storage, todo, counted(study), cfg.trials, cfg.metric, cfg.pruner)
    ran = 0
    bar = Progress(todo, f"tuning {cfg.study}", unit="trial", mode=progress)

    def objective(trial: optuna.Trial) -> float:
        values = {p.key: p.suggest(trial) for p in space}
        observer = TrialObserver(trial, cfg, storage)
        try:
            out = run_one(trial.number, values, observer)
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}"
            trial.set_user_attr(FAIL_REASON, reason[:2000])
            log.warning("trial %d failed (%s); the study goes on", trial.number, reason[:300])
            raise
        trial.set_user_attr("steps", out.steps)
        trial.set_user_attr("seconds", round(out.seconds, 1))
        for split, m in (("validation", out.validation), ("test", out.test)):
            for k in ("auc", "log_loss", "oracle_auc", "oracle_log_loss"):
                if k in m:
                    trial.set_user_attr(f"{split}_{k}", float(m[k]))
        if out.pruned_at:
            trial.set_user_attr("pruned_at_step", out.pruned_at)
            log.info("trial %d pruned at validation point %d (step %d) after %.0f s: %s",
                     trial.number, observer.pruned_at_point, out.pruned_at, out.seconds,
                     _fmt(values))
            raise optuna.TrialPruned()
        log.info("trial %d: validation %s %.4f%s in %.0f s: %s", trial.number, cfg.metric,
                 out.value, f", test {cfg.metric} {out.test[cfg.metric]:.4f}" if out.test else "",
                 out.seconds, _fmt(values))
        return float(out.value)

    def after(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        nonlocal ran
        ran += 1
        best = _best(study)
        bar.update(ran, **({"best": f"{best.value:.4f} (trial {best.number})"} if best else {}))
        if counted(study) >= cfg.trials:
            study.stop()

    with bar:
        study.optimize(objective, n_trials=todo, timeout=cfg.timeout_s, callbacks=[after],
                       catch=(Exception,), gc_after_trial=True)
    return StudyResult(study, ran, time.perf_counter() - start)


def _best(study: optuna.Study) -> optuna.trial.FrozenTrial | None:
    try:
        return study.best_trial
    except ValueError:  # no trial completed yet
        return None


def _fmt(values: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                     for k, v in values.items())


def best_values(study: optuna.Study, space: list[Param]) -> dict[str, Any]:
    """The best trial's value of every key of ``space`` (list choices drawn by index resolved)."""
    best = _best(study)
    if best is None:
        reasons = sorted({t.user_attrs.get(FAIL_REASON, t.state.name) for t in study.trials})
        raise RuntimeError(f"study {study.study_name!r}: no trial completed "
                           f"({len(study.trials)} trial(s): {'; '.join(reasons)[:1000]})")
    out = {}
    for p in space:
        out[p.key] = (p.args[best.params[f"{p.key}#"]] if f"{p.key}#" in best.params
                      else best.params[p.key])
    return out


def trials_table(study: optuna.Study):
    """Every trial as a row: number, state, value, the searched keys, validation and test
    metrics, pruning step and reason (pandas)."""
    return study.trials_dataframe(attrs=("number", "state", "value", "duration", "params",
                                         "user_attrs"))


def figures(study: optuna.Study) -> dict:
    """Optuna's optimisation history and (with two trials completed) parameter importances, as
    matplotlib figures."""
    from optuna.visualization import matplotlib as ovm

    out = {}
    S = optuna.trial.TrialState
    done = [t for t in study.get_trials(deepcopy=False) if t.state == S.COMPLETE]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if done:
            out["optimization_history.png"] = ovm.plot_optimization_history(study).figure
        if len(done) >= 2 and len({tuple(sorted(t.params.items())) for t in done}) >= 2:
            out["param_importances.png"] = ovm.plot_param_importances(
                study, evaluator=optuna.importance.PedAnovaImportanceEvaluator()).figure
    for fig in out.values():  # room for the keys' full names
        fig.set_size_inches(10, 5)
        fig.tight_layout()
    return out


def write_env(conf_root: str | Path, name: str, params: Mapping[str, Any], values: Mapping[str, Any],
              header: str, source_env: str | None = None) -> Path:
    """``conf/<name>/``: ``parameters_dlrm.yml`` holds the DLRM blocks of ``params`` (the study's
    merged parameters, every key resolved) with ``values`` set, so ``kedro run --env=<name>``
    trains the trial's config unchanged; the source env's other files (catalog, spark.yml,
    parameters_score.yml) are copied beside it. An earlier env of that name is replaced."""
    root = Path(conf_root)
    out = root / name
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    if source_env and source_env not in ("base", "local") and (root / source_env).is_dir():
        for f in sorted((root / source_env).iterdir()):
            if f.is_file() and f.name not in ("parameters_dlrm.yml", "parameters_tune.yml"):
                shutil.copy2(f, out / f.name)
    body = yaml.safe_dump(apply(params, values), sort_keys=False, default_flow_style=None,
                          width=100)
    comment = "".join(f"# {line}\n" if line else "#\n" for line in header.splitlines())
    (out / "parameters_dlrm.yml").write_text(comment + "\n" + body)
    return out
