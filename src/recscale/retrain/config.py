"""Typed ``retrain`` parameter block."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from recscale.config import Validated, check, check_choice
from recscale.runconfig import DLRMConfig

WARM_START_SOURCES = ("checkpoint", "latest", "champion")


@dataclass(frozen=True)
class PromotionConfig(Validated):
    """What the challenger must also clear, besides the champion, to take the alias."""

    # the challenger's AUC must exceed the best baseline's (evaluate.baselines) on the same rows
    beat_baseline: bool = False

    def validate(self, prefix: str = "retrain.promotion") -> None:
        check(isinstance(self.beat_baseline, bool), f"{prefix}.beat_baseline", self.beat_baseline,
              "true or false")


@dataclass(frozen=True)
class RetrainConfig(Validated):
    # where new raw partitions land: one Criteo TSV per day, consumed in natural name order
    landing_dir: str = "data/01_raw/daily"
    pattern: str = "day_*.tsv"
    # JSON ledger of the partitions already trained on (written atomically after registration)
    ledger: str = "data/02_intermediate/retrain_ledger.json"
    # parquet of the partitions being consumed (replaced on each retrain)
    work_dir: str = "data/05_model_input/retrain"
    # the last retrained model (state_dict + resolved config): the "latest" warm-start source
    model_dir: str = "data/06_models/retrain"
    # warm-start sources tried in order; [] = always start cold
    warm_start: tuple[str, ...] = ("checkpoint", "latest", "champion")
    # at most this many new partitions per run, oldest first (null = all of them)
    max_partitions: int | None = None
    # last fraction of the newest partition held out: challenger and champion are scored on it
    eval_fraction: float = 0.1
    registered_model: str = "recscale-dlrm"
    alias: str = "champion"
    # the challenger takes the alias when its AUC >= the champion's AUC + min_auc_gain
    min_auc_gain: float = 0.0
    promotion: PromotionConfig = field(default_factory=PromotionConfig)
    # a drill: kill_before_register SIGKILLs the driver after training, before the model is
    # registered (the ledger, the alias and the registry must be as they were; a rerun resumes)
    fault_injection: str | None = None

    def validate(self, prefix: str = "retrain") -> None:
        if self.fault_injection is not None:
            check_choice(f"{prefix}.fault_injection", self.fault_injection,
                         ("kill_before_register",))
        for i, s in enumerate(self.warm_start):
            check_choice(f"{prefix}.warm_start[{i}]", s, WARM_START_SOURCES)
        check(len(set(self.warm_start)) == len(self.warm_start), f"{prefix}.warm_start",
              list(self.warm_start), "each source at most once")
        check(self.max_partitions is None or self.max_partitions >= 1, f"{prefix}.max_partitions",
              self.max_partitions, "null or a positive integer")
        check(0 < self.eval_fraction < 1, f"{prefix}.eval_fraction", self.eval_fraction,
              "a fraction in (0, 1)")
        check(bool(self.registered_model.strip()), f"{prefix}.registered_model",
              self.registered_model, "a non-empty model name")
        check(re.fullmatch(r"[A-Za-z_][\w-]*", self.alias) is not None
              and re.fullmatch(r"[vV]\d+|latest", self.alias) is None, f"{prefix}.alias",
              self.alias, "a name of letters, digits, _ or - (MLflow reserves 'latest' and v<N>)")
        check(self.min_auc_gain >= -1 and self.min_auc_gain <= 1, f"{prefix}.min_auc_gain",
              self.min_auc_gain, "a number in [-1, 1]")


@dataclass(frozen=True)
class DLRMRetrainConfig(DLRMConfig):
    """The root config of ``dlrm_retrain``: every DLRM block plus ``retrain``. With the Criteo
    preset the partitions are Criteo day files; with a schema of your own (``features``), files
    or directories of its columns (parquet, or delimited text with a header: ``data.delimiter``),
    read through it."""

    retrain: RetrainConfig = field(default_factory=RetrainConfig)

    def validate(self, prefix: str = "") -> None:
        super().validate(prefix)
        key = f"{prefix + '.' if prefix else ''}retrain.promotion.beat_baseline"
        check(not self.retrain.promotion.beat_baseline or bool(self.evaluate.baselines), key,
              True, "false while evaluate.baselines is [] (there is no baseline to beat)")
