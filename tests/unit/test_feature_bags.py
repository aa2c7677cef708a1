"""Features sharing tables and mean pooling (``recscale.embedding.features``) against an fp64
reference written with torch's own embedding_bag: the pooled output, and one fused update of a
shared table (plain SGD and row-wise Adagrad, whose per-row state sees the gradient of every
feature of the table at once)."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from recscale.data.batch import SparseFeatures
from recscale.embedding import EmbeddingOptimizerConfig, FusedEmbeddingBags, table_init
from recscale.embedding.cache import TieredEmbeddingBags
from recscale.embedding.features import FeatureBags, feature_bags
from recscale.embedding.tier_config import TierConfig

ROWS, DIMS = (30, 50, 20), (8, 12, 4)
TABLES = (1, 0, 1, 2, 1)  # three features on table 1, in three slots
POOLING = ("mean", "sum", "sum", "mean", "mean")


def batch(seed: int, B: int = 9, max_len: int = 5, weighted: bool = False) -> SparseFeatures:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, max_len + 1, size=(len(TABLES), B))
    lengths[0, 0] = 0  # an empty bag under mean pooling
    values = np.concatenate([rng.integers(0, ROWS[t], int(lengths[f].sum()))
                             for f, t in enumerate(TABLES)])
    w = torch.from_numpy(rng.uniform(0.1, 2.0, len(values)).astype(np.float32)) \
        if weighted else None
    return SparseFeatures(tuple(f"f{i}" for i in range(len(TABLES))),
                          torch.from_numpy(values), torch.from_numpy(lengths), w)


def reference_pooled(weights, sparse: SparseFeatures) -> torch.Tensor:
    """Each feature's bags through torch's embedding_bag on its table (fp64)."""
    out, off = [], 0
    B = sparse.batch_size
    for f, t in enumerate(TABLES):
        ln = sparse.lengths[f]
        ids = sparse.values[off: off + int(ln.sum())]
        w = None if sparse.weights is None else \
            sparse.weights[off: off + int(ln.sum())].to(weights[t].dtype)
        off += int(ln.sum())
        offsets = torch.cat([torch.zeros(1, dtype=torch.int64), ln.cumsum(0)[:-1]])
        pooled = F.embedding_bag(ids, weights[t], offsets, mode="sum", per_sample_weights=w)
        if POOLING[f] == "mean":
            pooled = pooled / ln.clamp(min=1).unsqueeze(1).to(pooled.dtype)
        assert pooled.shape == (B, DIMS[t])
        out.append(pooled)
    return torch.cat(out, dim=1)


def make(optimizer: str = "exact_sgd", lr: float = 0.5, tiered: bool = False) -> FeatureBags:
    opt = EmbeddingOptimizerConfig(optimizer, lr)
    if tiered:
        inner = TieredEmbeddingBags(ROWS, DIMS, opt, seed=4, config=TierConfig(tier="ddr"),
                                    cache_fractions=[0.3] * 3)
    else:
        inner = FusedEmbeddingBags(ROWS, DIMS, opt, seed=4)
    return FeatureBags(inner, TABLES, POOLING)


@pytest.mark.parametrize("weighted", [False, True])
def test_pooled_output_equals_embedding_bag_per_feature_on_shared_tables(weighted):
    emb = make()
    assert emb.m == 3 and emb.dims == tuple(DIMS[t] for t in TABLES)
    sp = batch(0, weighted=weighted)
    weights = [table_init(4, t, r, d).double() for t, (r, d) in enumerate(zip(ROWS, DIMS))]
    with torch.no_grad():
        got = emb(sp)
    want = reference_pooled(weights, sp)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6, atol=1e-7)
    assert float(got[0, :DIMS[1]].abs().sum()) == 0.0  # the empty bag's mean


@pytest.mark.parametrize("optimizer", ["exact_sgd", "exact_rowwise_adagrad"])
@pytest.mark.parametrize("weighted", [False, True])
def test_one_update_of_a_shared_table_takes_every_features_gradient_at_once(optimizer, weighted):
    lr, eps = 0.5, 1e-8
    emb = make(optimizer, lr)
    sp = batch(1, weighted=weighted)
    g = torch.from_numpy(np.random.default_rng(2).normal(size=(sp.batch_size, emb.output_dim)))
    (emb(sp) * g.float()).sum().backward()
    got = [w.detach().double() for w in emb.split_weights()]

    weights = [table_init(4, t, r, d).double().requires_grad_()
               for t, (r, d) in enumerate(zip(ROWS, DIMS))]
    (reference_pooled(weights, sp) * g).sum().backward()
    for t, w in enumerate(weights):
        grad = w.grad
        if optimizer == "exact_sgd":
            want = w.detach() - lr * grad
        else:  # one state per row: the mean squared gradient over the row, all features summed
            state = (grad * grad).mean(dim=1, keepdim=True)
            want = w.detach() - lr * grad / (state.sqrt() + eps)
        np.testing.assert_allclose(got[t].numpy(), want.numpy(), rtol=1e-5, atol=1e-6,
                                   err_msg=f"table {t}")
    # the shared table's rows touched by two features moved by both features' gradients
    assert not torch.allclose(got[1], table_init(4, 1, ROWS[1], DIMS[1]).double())


def test_a_slow_tier_under_shared_tables_trains_like_memory():
    ref, tiered = make(), make(tiered=True)
    for seed in range(3):
        sp = batch(10 + seed, weighted=seed == 1)
        g = torch.from_numpy(np.random.default_rng(seed).normal(
            size=(sp.batch_size, ref.output_dim))).float()
        for emb in (ref, tiered):
            (emb(sp) * g).sum().backward()
    for a, b in zip(ref.split_weights(), tiered.split_weights()):
        np.testing.assert_allclose(b.detach().numpy(), a.detach().numpy(), rtol=1e-6, atol=1e-7)
    tiered.close()


def test_one_table_per_feature_summed_is_the_inner_collection_itself():
    inner = FusedEmbeddingBags(ROWS, DIMS, EmbeddingOptimizerConfig("exact_sgd", 0.1))
    assert feature_bags(inner, None) is inner
    assert feature_bags(inner, [0, 1, 2], ["sum"] * 3) is inner
    averaged = feature_bags(inner, [0, 1, 2], ["sum", "mean", "sum"])
    sp = SparseFeatures(("a", "b", "c"), torch.tensor([1, 2, 3, 4, 5, 6, 7]),
                        torch.tensor([[1, 1], [3, 0], [1, 1]]))
    with torch.no_grad():
        want = inner(sp)
        want[0, DIMS[0]: DIMS[0] + DIMS[1]] /= 3  # the 3-id bag averaged; the empty one stays 0
        np.testing.assert_allclose(averaged(sp).numpy(), want.numpy(), rtol=1e-6)


def test_a_table_no_feature_uses_or_an_unknown_pooling_is_refused():
    inner = FusedEmbeddingBags(ROWS, DIMS, EmbeddingOptimizerConfig("exact_sgd", 0.1))
    with pytest.raises(ValueError, match="must use each of the 3 tables"):
        FeatureBags(inner, [0, 0, 1])
    with pytest.raises(ValueError, match="pooling 'max' of feature #1"):
        FeatureBags(inner, [0, 1, 2], ["sum", "max", "sum"])


def test_an_empty_batch_gives_no_rows_of_every_feature():
    emb = make()
    sp = SparseFeatures(tuple(f"f{i}" for i in range(len(TABLES))), torch.zeros(0, dtype=torch.int64),
                        torch.zeros(len(TABLES), 0, dtype=torch.int64), torch.zeros(0))
    assert emb(sp).shape == (0, emb.output_dim)


def test_a_batch_named_ahead_is_the_same_batch_when_looked_up():
    """The loop names batch i + 1 to the cache before looking up batch i: the inner collection
    gets the very tensors it was named (a multi-tier collection matches them by identity)."""
    emb = make()
    a, b = batch(20), batch(21)
    seen = []
    emb.inner.prefetch = lambda s: seen.append(s)
    emb.prefetch(b)
    with torch.no_grad():
        emb(a)
        emb(b)
    assert emb._to_tables(b) is seen[0]


def test_the_index_buffers_live_on_the_inner_collections_device():
    """A sharded collection is built on its device and nothing moves the wrapper afterwards:
    its buffers must be made there (here the meta device stands for CUDA)."""
    class Inner(torch.nn.Module):
        dims = DIMS

        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1, device="meta"))

    emb = FeatureBags(Inner(), TABLES, POOLING)
    assert {b.device.type for b in emb.buffers()} == {"meta"}
    assert {b.device.type for b in make().buffers()} == {"cpu"}
