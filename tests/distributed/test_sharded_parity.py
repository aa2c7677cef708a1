"""2 ranks on gloo: every sharding type, alone and mixed, against a single-process run."""

import numpy as np
import pytest
import torch

from recscale.config import parse
from recscale.distributed import LaunchConfig, launch
from recscale.embedding import EmbeddingOptimizerConfig, FusedEmbeddingBags, table_init
from recscale.embedding.features import FeatureBags
from recscale.model import DLRM, ModelConfig
from recscale.runconfig import TrainConfig
from recscale.train import TrainStep
from recscale.train.step import make_dense_optimizer
from tests.distributed import workers as W

pytestmark = pytest.mark.dist

KINDS = ["table_wise", "row_wise", "column_wise", "table_row_wise", "table_column_wise",
         "data_parallel"]
OPTS = ["exact_sgd", "exact_rowwise_adagrad"]


def scenarios():
    out = []
    for opt in OPTS:
        for kind in KINDS:  # the table under test is t2 (64 rows); the others are table-wise
            out.append({"name": f"{kind}/{opt}", "optimizer": opt,
                        "kinds": ["table_wise", "table_wise", kind, "table_wise"]})
        out.append({"name": f"mixed/{opt}", "optimizer": opt,
                    "kinds": ["data_parallel", "row_wise", "column_wise", "table_row_wise"]})
    return out


MIXED_DIMS = {"data_parallel/column_wise/row_wise/table_row_wise": [8, 16, 4, 12],
              "table_wise/table_column_wise/row_wise/data_parallel": [12, 16, 8, 4]}


def mixed_dim_scenarios():
    """Tables of different dims (a feature schema's) under every sharding type, through the cat
    interaction (the dot one needs one dim)."""
    return [{"name": f"mixed_dims/{kinds}/{opt}", "optimizer": opt, "kinds": kinds.split("/"),
             "dims": dims, "model": {**W.MODEL, "interaction": "cat"}}
            for kinds, dims in MIXED_DIMS.items() for opt in OPTS]


def dcn_scenarios():
    """Multi-hot bags (0 to 12 ids) through the DCN-v2 interaction, mixed plan."""
    bags = W.make_global_batches(3, seed=5, max_len=12)
    return [{"name": f"dcn_multihot_mixed/{opt}", "optimizer": opt, "model": W.MODEL_DCN,
             "steps": bags, "kinds": ["data_parallel", "row_wise", "column_wise", "table_row_wise"]}
            for opt in OPTS]


SHARED_DIMS = [8, 16, 8, 12]


def shared_scenarios():
    """Features sharing tables (f4 on t2, f5 on t1), mean pooling (``W.SHARED_POOLING``) and
    weighted ids, at mixed dims through the cat interaction; t2, the shared table under test,
    takes every sharding type."""
    steps = W.make_global_batches(3, seed=7, max_len=4, feature_tables=W.SHARED_TABLES,
                                  weighted=True)
    return [{"name": f"shared/{kind}/{opt}", "optimizer": opt, "shared": True, "steps": steps,
             "kinds": ["table_wise", "data_parallel", kind, "row_wise"], "dims": SHARED_DIMS,
             "model": {**W.MODEL, "interaction": "cat"}}
            for kind in KINDS for opt in OPTS]


@pytest.fixture(scope="module")
def steps():
    return W.make_global_batches(4)


@pytest.fixture(scope="module")
def distributed(steps):
    cfg = LaunchConfig(world_size=2, collective_timeout_s=60)
    results = launch(W.parity_worker,
                     (scenarios() + dcn_scenarios() + mixed_dim_scenarios()
                      + shared_scenarios(), steps), cfg)
    return results[0]


def reference(optimizer: str, steps, split_columns: tuple[int, ...] = (), model_params=None,
              table_dims=None, shared: bool = False):
    """Single process, all tables in one fused module, mean loss over each global batch.
    ``split_columns``: tables kept as two column halves with their own optimizer state (what
    column sharding does with row-wise Adagrad), same layout and initial values;
    ``table_dims``: each table's dim (default ``W.DIM``); ``shared``: the features of
    ``W.SHARED_TABLES`` with ``W.SHARED_POOLING`` over the one fused module."""
    table_dims = table_dims or [W.DIM] * len(W.ROWS)
    tcfg = parse(TrainConfig, {"embedding_optimizer": {"name": optimizer, "learning_rate": 0.2},
                               "dense_optimizer": {"name": "sgd", "learning_rate": 0.1},
                               "seed": 3}, "train")
    rows, dims, inits, feat = [], [], [], []
    for t, r in enumerate(W.ROWS):
        full = table_init(3, t, r, table_dims[t])
        parts = [(0, 4), (4, table_dims[t])] if t in split_columns else [(0, table_dims[t])]
        for a, b in parts:
            rows.append(r)
            dims.append(b - a)
            inits.append(full[:, a:b])
            feat.append(t)
    emb = FusedEmbeddingBags(rows, dims, EmbeddingOptimizerConfig(optimizer, 0.2),
                             initial_weights=inits)
    if shared:
        emb = FeatureBags(emb, W.SHARED_TABLES, W.SHARED_POOLING)
        dims = list(emb.dims)
    model = DLRM(W.NUM_DENSE, dims if model_params and model_params.get("interaction") != "dot"
                 else len(W.ROWS), parse(ModelConfig, model_params or W.MODEL, "model"), emb, seed=3)
    step = TrainStep(model, make_dense_optimizer(model.dense_parameters(), tcfg.dense_optimizer))

    def widen(g):  # repeat the features of split tables so each half gets its ids
        batch = W.to_batch(g)
        if shared or batch.sparse.weights is not None:
            return batch
        lengths = batch.sparse.lengths
        off = batch.sparse.offsets()
        b = lengths.shape[1]
        vals = [batch.sparse.values[off[t * b]: off[(t + 1) * b]] for t in feat]
        batch.sparse.lengths = lengths[feat]
        batch.sparse.values = torch.cat(vals)
        return batch

    first = widen(W.concat_parts(steps[0]))
    with torch.no_grad():
        pooled = model.embeddings(first.sparse).numpy()
    for parts in steps:
        step(widen(W.concat_parts(parts)))
    weights = model.embeddings.split_weights()
    tables, i = [], 0
    for t in range(len(W.ROWS)):
        n = 2 if t in split_columns else 1
        tables.append(torch.cat([w.detach() for w in weights[i: i + n]], dim=1).numpy())
        i += n
    dense = {k: v.detach().numpy() for k, v in model.dense_arch.state_dict().items()}
    return pooled, tables, dense


def assert_equals_single_process(got: dict, pooled, tables, dense) -> None:
    """A sharded run's first pooled output, trained tables and dense weights against the single
    process's (``reference``), at the tolerances every parity test uses."""
    np.testing.assert_allclose(got["pooled"], pooled, rtol=1e-6, atol=1e-7)
    for t, (a, b) in enumerate(zip(got["tables"], tables)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=f"table {t}")
    for k in dense:
        np.testing.assert_allclose(got["dense"][k], dense[k], rtol=1e-5, atol=1e-6, err_msg=k)


@pytest.mark.parametrize("sc", scenarios(), ids=lambda s: s["name"])
def test_pooled_and_trained_weights_equal_the_single_process_run(distributed, steps, sc):
    got = distributed[sc["name"]]
    pooled, tables, dense = reference(sc["optimizer"], steps)
    assert set(got["dense"]) == set(dense)
    assert_equals_single_process(got, pooled, tables, dense)


def test_tables_really_changed_and_bytes_were_counted(distributed, steps):
    got = distributed["mixed/exact_sgd"]
    init = [table_init(3, t, r, W.DIM).numpy() for t, r in enumerate(W.ROWS)]
    assert all(not np.allclose(a, b) for a, b in zip(got["tables"], init))
    names = set(got["bytes"])
    assert {"input", "output", "output_grad", "dp_input",
            "dp_output_grad", "dense_allreduce"} <= names
    assert all(v["bytes"] > 0 for k, v in got["bytes"].items() if k != "input_counts")


def test_column_shards_share_the_row_state_that_per_shard_state_would_get_wrong(distributed, steps):
    """What the row-state exchange buys: the per-shard state (TorchRec's behaviour) differs from
    the unsharded update that the column-sharded table matches."""
    got = distributed["column_wise/exact_rowwise_adagrad"]
    _, per_shard, _ = reference("exact_rowwise_adagrad", steps, split_columns=(2,))
    _, exact, _ = reference("exact_rowwise_adagrad", steps)
    assert not np.allclose(per_shard[2], exact[2], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["tables"][2], exact[2], rtol=1e-5, atol=1e-6)
    assert got["bytes"]["cw_row_state"]["bytes"] > 0


@pytest.mark.parametrize("sc", dcn_scenarios(), ids=lambda s: s["name"])
def test_dcn_with_multi_hot_bags_equals_the_single_process_run(distributed, sc):
    got = distributed[sc["name"]]
    assert max(int(p["lengths"].max()) for parts in sc["steps"] for p in parts) > 3
    pooled, tables, dense = reference(sc["optimizer"], sc["steps"], model_params=sc["model"])
    assert any(k.startswith("cross.") for k in dense)
    assert set(got["dense"]) == set(dense)
    assert_equals_single_process(got, pooled, tables, dense)


@pytest.mark.parametrize("sc", mixed_dim_scenarios(), ids=lambda s: s["name"])
def test_tables_of_different_dims_train_like_one_process_under_every_sharding_type(
        distributed, steps, sc):
    got = distributed[sc["name"]]
    pooled, tables, dense = reference(sc["optimizer"], steps, model_params=sc["model"],
                                      table_dims=sc["dims"])
    assert [t.shape[1] for t in got["tables"]] == sc["dims"]
    assert got["pooled"].shape[1] == sum(sc["dims"])
    assert_equals_single_process(got, pooled, tables, dense)


@pytest.mark.parametrize("sc", shared_scenarios(), ids=lambda s: s["name"])
def test_features_sharing_tables_with_mean_pooling_train_like_one_process(distributed, sc):
    """Two features on one table (every sharding type for it), mean and sum pooling, weighted
    ids, mixed dims: the pooled output, the shared tables after training and the dense weights
    equal the unsharded module's."""
    got = distributed[sc["name"]]
    pooled, tables, dense = reference(sc["optimizer"], sc["steps"], model_params=sc["model"],
                                      table_dims=sc["dims"], shared=True)
    assert [t.shape[1] for t in got["tables"]] == sc["dims"]  # one table each, not per feature
    assert got["pooled"].shape[1] == sum(sc["dims"][t] for t in W.SHARED_TABLES)
    assert_equals_single_process(got, pooled, tables, dense)
