"""``tune``: the study a ``kedro run --pipelines=tune`` runs (``docs/tuning.md``)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal

from recscale.config import Validated, check, check_choice

METRICS = ("auc", "log_loss")
PRUNERS = ("median", "halving", "none")


@dataclass(frozen=True)
class TuneConfig(Validated):
    """The study: its name and storage, the validation ``metric`` it optimises, how many trials
    (or seconds), the sampler's seed, the pruner, where the best trial's parameters go, and the
    ``space`` (``recscale.tune.space``)."""

    study: str = "dlrm"
    # null: a SQLite file data/07_model_output/tune/<study>.db (the same command resumes it); any
    # SQLAlchemy URL shares the study between processes or hosts (postgresql://..., sqlite:///...)
    storage: str | None = None
    metric: Literal["auc", "log_loss"] = "auc"  # of the validation split; the test split is
    # scored for the record only
    trials: int = 20  # trials of the whole study (every state), over all commands that run it
    timeout_s: float | None = None  # this command stops starting trials after this many seconds
    seed: int = 0  # the TPE sampler's
    startup_trials: int = 5  # TPE draws at random for the first this many trials
    pruner: Literal["median", "halving", "none"] = "median"
    # validation points of a trial before the pruner may stop it
    min_points: int = 2
    test: bool = True  # score each finished trial on the test split too (never chosen on)
    best_env: str | None = None  # conf/<best_env>/ gets the best trial's parameters; null: tuned_<study>
    space: dict[str, Any] = field(default_factory=dict)

    @property
    def maximize(self) -> bool:
        return self.metric == "auc"

    @property
    def env_name(self) -> str:
        return self.best_env or f"tuned_{self.study}"

    def storage_url(self, root: str = ".") -> str:
        return self.storage or f"sqlite:///{root}/data/07_model_output/tune/{self.study}.db"

    def validate(self, prefix: str = "tune") -> None:
        name = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
        check(bool(name.match(self.study)), f"{prefix}.study", self.study,
              "a name of letters, digits, '_', '-', '.'")
        check_choice(f"{prefix}.metric", self.metric, METRICS)
        check_choice(f"{prefix}.pruner", self.pruner, PRUNERS)
        check(self.trials >= 1, f"{prefix}.trials", self.trials, "a positive integer")
        check(self.timeout_s is None or self.timeout_s > 0, f"{prefix}.timeout_s", self.timeout_s,
              "null or a positive number of seconds")
        check(self.startup_trials >= 0, f"{prefix}.startup_trials", self.startup_trials, ">= 0")
        check(self.min_points >= 1, f"{prefix}.min_points", self.min_points, ">= 1")
        check(self.best_env is None or bool(name.match(self.best_env)) and self.best_env not in
              ("base", "local"), f"{prefix}.best_env", self.best_env,
              "null or a new env's name (not base or local)")
        check(self.storage is None or "://" in self.storage, f"{prefix}.storage", self.storage,
              "null (a SQLite file under data/) or a database URL such as sqlite:///study.db")
