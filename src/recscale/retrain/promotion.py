"""The promotion rule: the challenger takes the alias only when it scores at least as well as
the champion on the same evaluation rows."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Decision:
    promote: bool
    reason: str


def decide_promotion(challenger_auc: float, champion_auc: float | None, min_gain: float = 0.0,
                     eval_data: str = "the evaluation rows") -> Decision:
    """``champion_auc`` None = there is no champion yet (the challenger becomes it)."""
    if not math.isfinite(challenger_auc):
        return Decision(False, f"challenger AUC is {challenger_auc} on {eval_data}: not promoted")
    if champion_auc is None:
        return Decision(True, f"no champion yet: challenger (AUC {challenger_auc:.4f} on "
                              f"{eval_data}) becomes it")
    need = champion_auc + min_gain
    if challenger_auc >= need:
        return Decision(True, f"challenger AUC {challenger_auc:.4f} >= champion AUC "
                              f"{champion_auc:.4f} + {min_gain:g} on {eval_data}")
    return Decision(False, f"challenger AUC {challenger_auc:.4f} < champion AUC "
                           f"{champion_auc:.4f} + {min_gain:g} on {eval_data}: champion kept")
