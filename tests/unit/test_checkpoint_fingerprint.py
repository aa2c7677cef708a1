"""A checkpoint is refused by a model it does not fit: other table sizes, or features arranged
otherwise over the tables (shared, averaged, weighted), named in the error."""

import pytest

from recscale.config import parse
from recscale.data.schema import FittedSchema, parse_features
from recscale.model.dlrm import ModelConfig
from recscale.runconfig import TrainConfig
from recscale.train.checkpoint import model_fingerprint
from recscale.train.checkpoint_files import CheckpointError, check_fingerprint

BASE = {"sparse": [{"name": "item", "table": "items"},
                   {"name": "history", "kind": "multi_hot", "table": "items"},
                   {"name": "tags", "kind": "multi_hot"}]}


def fingerprint(features: dict, rows=(50, 20)) -> dict:
    fitted = FittedSchema.fit(parse_features(features), list(rows))
    manifest = {"table_sizes": list(fitted.table_rows), "schema": fitted.to_dict()}
    return model_fingerprint(manifest, parse(ModelConfig, {}, "model"),
                             parse(TrainConfig, {}, "train"))


def test_the_same_arrangement_loads_and_a_checkpoint_without_the_key_too():
    fp = fingerprint(BASE)
    assert fp["features"] == {"tables": [0, 0, 1], "pooling": ["sum"] * 3, "weighted": []}
    check_fingerprint("ckpt", {"fingerprint": fp}, fingerprint(BASE))
    old = {k: v for k, v in fp.items() if k != "features"}  # written before the key existed
    check_fingerprint("ckpt", {"fingerprint": old}, fp)


@pytest.mark.parametrize("change", [
    {"sparse": [{"name": "item", "table": "items"}, {"name": "history", "kind": "multi_hot"},
                {"name": "tags", "kind": "multi_hot", "table": "items"}]},
    {"sparse": [*BASE["sparse"][:2], {"name": "tags", "kind": "multi_hot", "pooling": "mean"}]},
    {"sparse": [*BASE["sparse"][:2], {"name": "tags", "kind": "multi_hot", "weights": "w"}]},
])
def test_features_arranged_otherwise_over_the_same_tables_are_refused(change):
    with pytest.raises(CheckpointError, match=r"checkpoint ckpt was written for features=.* "
                                              r"this run has features="):
        check_fingerprint("ckpt", {"fingerprint": fingerprint(BASE)}, fingerprint(change))
