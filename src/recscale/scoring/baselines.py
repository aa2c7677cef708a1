"""The baselines of a dataset (``recscale.evaluate.baselines``) fitted on its train split and
scored on one of its splits, read through the same loader, in the same row order, as
``score_split`` reads the model's rows."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from recscale.data.loader import LoaderConfig, make_loader
from recscale.data.schema import FittedSchema
from recscale.evaluate.baselines import (
    BaselineConfig,
    BaselineScores,
    FeatureLayout,
    FittedBaselines,
    fit_baselines,
    score_baselines,
)


def feature_layout(manifest: dict) -> FeatureLayout:
    """The manifest's fitted schema as the baselines see it."""
    fs = FittedSchema.of(manifest)
    return FeatureLayout(fs.sparse_names, fs.feature_tables(), fs.table_rows, fs.pooling(),
                         fs.num_dense)


def split_source(manifest: dict, split: str, batch_size: int):
    """A source of the batches of ``split`` (every row, in order), or None when it has none."""
    part = manifest["splits"].get(split)
    if not part or not part.get("rows") or not part.get("files"):
        return None
    rows = FittedSchema.of(manifest).feature_rows()
    return lambda: make_loader(part["files"], LoaderConfig(batch_size=batch_size,
                                                           table_rows=rows))


@dataclass
class SplitBaselines:
    fitted: FittedBaselines
    scores: BaselineScores


def baselines_on_split(manifest: dict, split: str, names: Sequence[str], batch_size: int,
                       cfg: BaselineConfig | None = None,
                       rows: np.ndarray | None = None) -> SplitBaselines:
    """The baselines ``names`` fitted on the train split (settings chosen on the validation
    split when it has rows) and scored on every row of ``split``. ``rows``: the row numbers
    the model was scored on (``score_split``'s), which the baselines' rows must equal."""
    if split not in manifest["splits"]:
        raise ValueError(f"split={split!r} is not allowed: expected one of "
                         f"{', '.join(manifest['splits'])}")
    if cfg is None:  # updates of 256 to 4,096 rows, so that a small split makes enough of them
        n = int(manifest["splits"].get("train", {}).get("rows") or 0)
        base = BaselineConfig()
        cfg = dataclasses.replace(base, update_rows=int(np.clip(
            n // base.min_updates, 256, base.update_rows)))
    # the train split in batches of the logistic regression's updates (none is cut again)
    train = split_source(manifest, "train", cfg.update_rows)
    if train is None:
        raise ValueError("the baselines are fitted on the train split, which has no rows")
    fitted = fit_baselines(names, feature_layout(manifest), train,
                           split_source(manifest, "validation", batch_size), cfg)
    source = split_source(manifest, split, batch_size)
    scores = score_baselines(fitted, source if source is not None else list)
    if rows is not None and not np.array_equal(scores.rows, np.asarray(rows)):
        raise RuntimeError(f"the baselines scored {scores.rows.size} rows of {split} that are "
                           f"not the model's {np.asarray(rows).size}")
    return SplitBaselines(fitted, scores)
