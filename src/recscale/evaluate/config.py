"""The ``evaluate`` block: which split the evaluation scores, in batches of how many rows, and
the baselines fitted beside the model. Read by the evaluation node and by serving (a logged
model's resolved config), both through this type."""

from __future__ import annotations

from dataclasses import dataclass

from recscale.config import Validated, check, check_choice
from recscale.evaluate.baselines import BASELINES


@dataclass(frozen=True)
class EvaluateConfig(Validated):
    split: str = "test"
    batch_size: int = 16384
    # cheap baselines fitted on the train split and scored on the same rows as the model
    # (recscale.evaluate.baselines.BASELINES); () = none
    baselines: tuple[str, ...] = BASELINES

    def validate(self, prefix: str = "evaluate") -> None:
        check_choice(f"{prefix}.split", self.split, ("train", "validation", "test"))
        check(self.batch_size > 0, f"{prefix}.batch_size", self.batch_size, "a positive integer")
        for i, name in enumerate(self.baselines):
            check_choice(f"{prefix}.baselines[{i}]", name, BASELINES)
        check(len(set(self.baselines)) == len(self.baselines), f"{prefix}.baselines",
              list(self.baselines), "each baseline at most once")
