"""The promotion rule: the challenger takes the alias only when it scores at least as well as
the champion on the same evaluation rows (and, with ``retrain.promotion.beat_baseline``, better
than the best cheap baseline on them); and the comparison that feeds it."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from recscale.evaluate import lift_metrics, metrics_with_oracle
from recscale.model import model_from_resolved
from recscale.scoring import score_split
from recscale.scoring.baselines import baselines_on_split


@dataclass(frozen=True)
class Decision:
    promote: bool
    reason: str


def decide_promotion(challenger_auc: float, champion_auc: float | None, min_gain: float = 0.0,
                     eval_data: str = "the evaluation rows",
                     baseline: tuple[str, float] | None = None) -> Decision:
    """``champion_auc`` None = there is no champion yet (the challenger becomes it).
    ``baseline``: (name, AUC) of the best baseline on the same rows, which the challenger's AUC
    must exceed (``retrain.promotion.beat_baseline``); None = no such requirement."""
    if not math.isfinite(challenger_auc):
        return Decision(False, f"challenger AUC is {challenger_auc} on {eval_data}: not promoted")
    if baseline is not None:
        name, auc = baseline
        if not challenger_auc > auc:
            return Decision(False, f"challenger AUC {challenger_auc:.4f} does not beat baseline "
                                   f"{name} AUC {auc:.4f} on {eval_data}: not promoted")
    if champion_auc is None:
        return Decision(True, f"no champion yet: challenger (AUC {challenger_auc:.4f} on "
                              f"{eval_data}) becomes it")
    need = champion_auc + min_gain
    if challenger_auc >= need:
        return Decision(True, f"challenger AUC {challenger_auc:.4f} >= champion AUC "
                              f"{champion_auc:.4f} + {min_gain:g} on {eval_data}")
    return Decision(False, f"challenger AUC {challenger_auc:.4f} < champion AUC "
                           f"{champion_auc:.4f} + {min_gain:g} on {eval_data}: champion kept")


@dataclass
class Comparison:
    """Challenger and champion scored on the same held-out rows, and the decision."""

    challenger: dict[str, float]  # metrics (with the oracle AUC when the data is synthetic)
    champion_auc: float | None
    decision: Decision
    scored: dict[str, tuple] = field(default_factory=dict)  # name -> (labels, probabilities)
    best_baseline: tuple[str, float] | None = None  # (name, AUC) on the same rows


def compare_with_champion(challenger, manifest: dict, batch_size: int, min_gain: float,
                          champion: tuple[str, dict, dict] | None = None,
                          baselines: tuple[str, ...] = (),
                          beat_baseline: bool = False) -> Comparison:
    """Score the challenger model on the manifest's test split and, when there is a champion
    (``(name, state_dict, resolved config)``), the champion on the same rows; decide by
    ``decide_promotion``. ``baselines`` (``recscale.evaluate.baselines``): fitted on the
    manifest's train split and scored on the same rows (their AUC and log loss and the
    challenger's lift join its metrics); ``beat_baseline``: the challenger must beat the best of
    them. A champion whose tables have other sizes cannot be scored on these rows: the
    challenger is then not promoted and the reason says so."""
    if beat_baseline and not baselines:
        raise ValueError("beat_baseline needs at least one baseline (evaluate.baselines)")
    where = manifest["eval_data"]
    oracle = (np.concatenate([np.load(o, mmap_mode="r") for o in manifest["oracle_paths"]])
              if manifest.get("oracle_paths") else None)
    s = score_split(challenger, manifest, "test", batch_size)
    metrics = metrics_with_oracle(s.labels, s.probs, s.rows, oracle)
    scored = {"challenger": (s.labels, s.probs)}
    best = None
    if baselines:
        b = baselines_on_split(manifest, "test", baselines, batch_size, rows=s.rows)
        lift = lift_metrics(s.labels, s.probs, b.scores.probs)
        metrics.update({k: v for k, v in lift.items() if k != "best"})
        scored.update({f"baseline {n}": (s.labels, p) for n, p in b.scores.probs.items()})
        if "auc" in lift["best"]:
            name = lift["best"]["auc"]
            best = (name, metrics[f"baseline.{name}.auc"])
    rule = best if beat_baseline else None
    champion_auc = None
    if champion is not None:
        name, state, resolved = champion
        if list(resolved.get("table_sizes") or []) != list(manifest["table_sizes"]):
            return Comparison(metrics, None, Decision(False, (
                f"champion {name} hashes ids into tables of other sizes "
                f"({resolved.get('table_sizes')} vs {manifest['table_sizes']}): it cannot be "
                "scored on the same rows, so the challenger is not promoted; move the alias by "
                "hand")), scored, best)
        c = score_split(model_from_resolved(resolved, state), manifest, "test", batch_size)
        champion_auc = metrics_with_oracle(c.labels, c.probs, c.rows)["auc"]
        scored[name] = (c.labels, c.probs)
    return Comparison(metrics, champion_auc,
                      decide_promotion(metrics["auc"], champion_auc, min_gain, where, rule),
                      scored, best)
