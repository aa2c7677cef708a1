"""Tiered embeddings: tables on DDR/SSD behind a software cache train bitwise like in memory."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from recscale.config import ConfigError, parse
from recscale.data.batch import SparseFeatures
from recscale.embedding import (
    CacheTooSmallError,
    EmbeddingCollection,
    EmbeddingOptimizerConfig,
    FusedEmbeddingBags,
    InitSlice,
    MultiTierEmbeddingBags,
    Placement,
    TierConfig,
    TieredEmbeddingBags,
    build_embedding_bags,
    table_init,
)
from recscale.embedding.tbe import table_init_chunks

ROWS = (2000, 1500, 3000)  # each table 10x its cache (cache_fraction 0.1)
DIMS = (8, 16, 4)
B = 64
ROOT = Path(__file__).resolve().parents[2]


def zipf_batches(n: int, rows=ROWS, batch=B, seed: int = 0, a: float = 1.2) -> list[SparseFeatures]:
    """Random bags (0-3 ids per sample and table), ids Zipf-distributed over a random
    permutation of each table's rows (hot rows scattered, many repeats within a batch)."""
    rng = np.random.default_rng(seed)
    perms = [rng.permutation(r) for r in rows]
    out = []
    for _ in range(n):
        lengths = rng.integers(0, 4, size=(len(rows), batch))
        vals = [perms[t][(rng.zipf(a, int(lengths[t].sum())) - 1) % r] for t, r in enumerate(rows)]
        out.append(SparseFeatures(tuple(f"f{t}" for t in range(len(rows))),
                                  torch.from_numpy(np.concatenate(vals)).long(),
                                  torch.from_numpy(lengths).long()))
    return out


def train(module, batches, seed: int = 1, prefetch: bool = True) -> list[torch.Tensor]:
    """Forward + backward with random upstream gradients; the next batch is named for prefetch.
    -> pooled outputs."""
    g = torch.Generator().manual_seed(seed)
    pooled = []
    for i, b in enumerate(batches):
        if prefetch and i + 1 < len(batches):
            module.prefetch(batches[i + 1])
        out = module(b)
        pooled.append(out.detach().clone())
        (out * torch.randn(out.shape, generator=g)).sum().backward()
    return pooled


def assert_tables_equal(a, b) -> None:
    for t, (x, y) in enumerate(zip(a.split_weights(), b.split_weights())):
        assert torch.equal(x, y), f"table {t} weights differ"
    sa, sb = a.split_optimizer_states(), b.split_optimizer_states()
    assert len(sa) == len(sb)
    for t, (x, y) in enumerate(zip(sa, sb)):
        for u, v in zip(x, y):
            assert torch.equal(u, v), f"table {t} optimizer state differs"


def tiered(opt: str, tier: str = "ssd", policy: str = "lru", tmp=None, **kw) -> TieredEmbeddingBags:
    cfg = TierConfig(tier=tier, cache_fraction=0.1, policy=policy, min_cache_rows=1,
                     scratch_dir=str(tmp or ""), **kw)
    return TieredEmbeddingBags(ROWS, DIMS, EmbeddingOptimizerConfig(opt, 0.3), seed=4, config=cfg)


@pytest.mark.parametrize("tier", ["ddr", "ssd"])
@pytest.mark.parametrize("policy", ["lru", "lfu"])
@pytest.mark.parametrize("opt", ["exact_sgd", "exact_rowwise_adagrad"])
def test_table_10x_its_cache_trains_bitwise_like_in_memory(opt, policy, tier, tmp_path):
    ref = FusedEmbeddingBags(ROWS, DIMS, EmbeddingOptimizerConfig(opt, 0.3), seed=4)
    m = tiered(opt, tier, policy, tmp_path)
    assert all(r == 10 * c for r, c in zip(m.rows, m.cache_rows))
    batches = zipf_batches(16)
    want, got = train(ref, batches), train(m, batches)
    for i, (a, b) in enumerate(zip(want, got)):
        assert torch.equal(a, b), f"pooled output of step {i} differs"
    s = m.tier_stats()  # the cache really was too small: rows were evicted and written back
    assert s["evictions"] > 500 and s["rows_written"] > 500 and s["prefetch_rows"] > 0
    assert 0.3 < s["hit_rate"] < 0.95
    assert s[f"bytes_read.{tier}"] > 0 and s[f"bytes_written.{tier}"] > 0
    assert_tables_equal(ref, m)
    m.close()


def test_exact_adagrad_and_no_prefetch_are_bitwise_too(tmp_path):
    opt = EmbeddingOptimizerConfig("exact_adagrad", 0.3)
    ref = FusedEmbeddingBags(ROWS, DIMS, opt, seed=4)
    m = TieredEmbeddingBags(ROWS, DIMS, opt, seed=4, config=TierConfig(
        tier="ssd", cache_fraction=0.1, min_cache_rows=1, prefetch=False,
        scratch_dir=str(tmp_path)))
    batches = zipf_batches(10, seed=5)
    train(ref, batches)
    train(m, batches)
    assert m.tier_stats()["prefetch_rows"] == 0 and m.tier_stats()["evictions"] > 0
    assert_tables_equal(ref, m)


def test_init_blocks_equal_table_init_and_shard_slices():
    full = table_init(7, 3, 1001, 12)
    assert torch.equal(torch.cat(list(table_init_chunks(7, 3, 1001, 12, chunk_rows=97))), full)
    sl = InitSlice(3, 1001, 12, row_offset=301, col_offset=4)
    got = torch.zeros(400, 8)
    for r0, block in sl.blocks(7, 400, 8, chunk_rows=64):
        got[r0: r0 + block.shape[0]] = block
    assert torch.equal(got, full[301:701, 4:12])
    assert torch.equal(sl.materialize(7, 400, 8), full[301:701, 4:12])


def test_lru_evicts_the_least_recently_used_and_lfu_the_least_frequent():
    def run(policy):
        m = TieredEmbeddingBags([100], [4], EmbeddingOptimizerConfig("exact_sgd", 0.1),
                                config=TierConfig(tier="ddr", cache_fraction=0.04,
                                                  min_cache_rows=1, policy=policy))
        assert m.cache_rows == (4,)
        for ids in ([0, 1, 2, 3], [1, 1], [1], [2], [3], [0], [4]):
            m(SparseFeatures(("a",), torch.tensor(ids), torch.tensor([[len(ids)]])))
        return set(m.key_of_slot.tolist())

    # LRU: 1 was used longest ago when 4 came in; LFU: 1 was used most (4 times), 2, 3 and 0
    # twice each, and the tie among them goes to the least recently used (2)
    assert run("lru") == {0, 2, 3, 4}
    assert run("lfu") == {1, 3, 0, 4}


def test_a_batch_wider_than_the_cache_fails_naming_table_ids_and_cache_rows():
    m = TieredEmbeddingBags([1000, 50], [4, 4], EmbeddingOptimizerConfig("exact_sgd", 0.1),
                            config=TierConfig(tier="ddr", cache_fraction=0.01,
                                              min_cache_rows=1))
    sp = SparseFeatures(("a", "b"), torch.cat([torch.arange(11), torch.tensor([1])]),
                        torch.tensor([[11], [1]]))
    with pytest.raises(CacheTooSmallError, match=r"table 0 \(1000 rows.*11 distinct ids.*10 rows"):
        m(sp)
    with pytest.raises(IndexError, match=r"table 1: id 50 is out of range \[0, 50\)"):
        m(SparseFeatures(("a", "b"), torch.tensor([1, 50]), torch.tensor([[1], [1]])))


def test_config_errors_name_the_key():
    with pytest.raises(ConfigError, match=r"train.tiers.policy='fifo'.*'lru', 'lfu'"):
        parse(TierConfig, {"policy": "fifo"}, "train.tiers")
    with pytest.raises(ConfigError, match=r"train.tiers.cache_fraction=1.5.*\(0, 1\]"):
        parse(TierConfig, {"cache_fraction": 1.5}, "train.tiers")
    with pytest.raises(ConfigError, match=r"train.tiers.cache_load_factor is not allowed: it is "
                                          r"now train.tiers.cache_fraction"):
        parse(TierConfig, {"cache_load_factor": 0.1}, "train.tiers")
    with pytest.raises(ConfigError, match=r"train.tiers.ram_budget_bytes=-1"):
        parse(TierConfig, {"ram_budget_bytes": -1}, "train.tiers")
    with pytest.raises(ConfigError, match=r"unknown key train.tiers.cache"):
        parse(TierConfig, {"cache": 0.1}, "train.tiers")


def test_checkpoint_views_restore_and_training_resumes_identically(tmp_path):
    """split_weights()/split_optimizer_states() are the whole tables after a flush; copying a
    checkpoint into them (load_state) and training on equals the in-memory run restored the same way."""
    opt = EmbeddingOptimizerConfig("exact_rowwise_adagrad", 0.3)
    batches = zipf_batches(12, seed=2)
    ref = FusedEmbeddingBags(ROWS, DIMS, opt, seed=4)
    train(ref, batches[:6])
    ckpt = ([w.clone() for w in ref.split_weights()],
            [[s.clone() for s in st] for st in ref.split_optimizer_states()])
    train(ref, batches[6:], seed=9)

    m = tiered("exact_rowwise_adagrad", "ssd", "lfu", tmp_path)
    train(m, batches[:3])  # somewhere else entirely, with a warm, dirty cache
    m.load_state(*ckpt)
    for w, c in zip(m.split_weights(), ckpt[0]):
        assert torch.equal(w, c)
    train(m, batches[6:], seed=9)
    assert_tables_equal(ref, m)
    # the copy-into-views route (what checkpoint code does with FusedEmbeddingBags) works too
    with torch.no_grad():
        for v, c in zip(m.split_weights(), ckpt[0]):
            v.copy_(c)
        for vs, cs in zip(m.split_optimizer_states(), ckpt[1]):
            vs[0].copy_(cs[0])
    m.flush()
    with torch.no_grad():  # the in-memory module restored the same way

        for v, c in zip(ref.split_weights(), ckpt[0]):
            v.copy_(c)
        for vs, cs in zip(ref.split_optimizer_states(), ckpt[1]):
            vs[0].copy_(cs[0])
    train(ref, batches[6:9], seed=11)
    train(m, batches[6:9], seed=11)
    assert_tables_equal(ref, m)


def test_mixed_placements_in_one_module_are_bitwise(tmp_path):
    opt = EmbeddingOptimizerConfig("exact_rowwise_adagrad", 0.3)
    ref = FusedEmbeddingBags(ROWS, DIMS, opt, seed=4)
    cfg = TierConfig(min_cache_rows=1, scratch_dir=str(tmp_path))
    m = build_embedding_bags(ROWS, DIMS, opt, [Placement("ssd", 0.1), Placement("memory"),
                                               Placement("ddr", 0.2)], cfg, seed=4)
    assert isinstance(m, MultiTierEmbeddingBags)
    batches = zipf_batches(8, seed=3)
    for a, b in zip(train(ref, batches), train(m, batches)):
        assert torch.equal(a, b)
    assert_tables_equal(ref, m)
    s = m.tier_stats()
    assert s["bytes_read.ssd"] > 0 and s["bytes_read.ddr"] > 0
    m.close()


def test_a_prefetched_batch_is_split_by_tier_once(tmp_path, monkeypatch):
    """The forward of a batch named by prefetch (or of a view of its tensors, as the sharded
    collection passes it) takes the parts the prefetch made; other batches are split anew, and
    the pooled outputs stay bitwise those of the unsplit module."""
    opt = EmbeddingOptimizerConfig("exact_rowwise_adagrad", 0.3)
    ref = FusedEmbeddingBags(ROWS, DIMS, opt, seed=4)
    cfg = TierConfig(min_cache_rows=1, scratch_dir=str(tmp_path))
    m = build_embedding_bags(ROWS, DIMS, opt, [Placement("ssd", 0.1), Placement("memory"),
                                               Placement("memory")], cfg, seed=4)
    splits = []
    real = MultiTierEmbeddingBags._split

    def counted(self, sparse):
        splits.append(sparse)
        return real(self, sparse)

    monkeypatch.setattr(MultiTierEmbeddingBags, "_split", counted)
    batches = zipf_batches(8, seed=5)
    views = [SparseFeatures(b.keys, b.values[:], b.lengths.view(b.lengths.shape))
             for b in batches]
    for a, b in zip(train(ref, batches[:4]), train(m, batches[:4])):
        assert torch.equal(a, b)
    assert len(splits) == 4  # the first batch in its forward, the others in their prefetch
    m.prefetch(batches[4])
    copy = SparseFeatures(batches[4].keys, batches[4].values.clone(), batches[4].lengths.clone())
    g = torch.Generator().manual_seed(2)
    for b in (copy, views[5]):  # equal ids in other memory; a batch never named
        assert torch.equal(ref(b), m(b))
    assert len(splits) == 7
    for i in (6, 7):
        m.prefetch(batches[i])
        out, want = m(views[i]), ref(batches[i])
        assert torch.equal(out, want)
        grad = torch.randn(out.shape, generator=g)
        (out * grad).sum().backward()
        (want * grad).sum().backward()
    assert len(splits) == 9 and m._named == []  # batch 4's parts dropped with batch 6's
    assert_tables_equal(ref, m)
    m.close()


# --- the EmbeddingCollection interface ----------------------------------------------------------
def _one_rank_sharded(opt: EmbeddingOptimizerConfig):
    from recscale.embedding.sharded import ShardedEmbeddingCollection
    from recscale.sharding import TableSpec, Topology, plan_sharding

    names = tuple(f"f{t}" for t in range(len(ROWS)))
    plan = plan_sharding([TableSpec(f"t{t}", r, d, feature_names=(names[t],))
                          for t, (r, d) in enumerate(zip(ROWS, DIMS))],
                         Topology.preset("cpu-local", world_size=1), B)
    return ShardedEmbeddingCollection(plan, names, opt, rank=0, world_size=1, seed=4)


def test_every_collection_implements_the_embedding_collection_protocol(tmp_path):
    opt = EmbeddingOptimizerConfig("exact_rowwise_adagrad", 0.3)
    cfg = TierConfig(min_cache_rows=1, scratch_dir=str(tmp_path))
    fused = FusedEmbeddingBags(ROWS, DIMS, opt, seed=4)
    tiered_ddr = tiered("exact_rowwise_adagrad", "ddr")
    multi = build_embedding_bags(ROWS, DIMS, opt, [Placement("ssd", 0.1), Placement("memory"),
                                                   Placement("ddr", 0.2)], cfg, seed=4)
    sharded = _one_rank_sharded(opt)
    for m in (fused, tiered_ddr, multi, sharded):
        assert isinstance(m, EmbeddingCollection), type(m).__name__
        assert m.output_dim == sum(DIMS)
        assert m.memory_bytes()["fast"] > 0
    assert not isinstance(torch.nn.Linear(2, 2), EmbeddingCollection)
    sp = zipf_batches(1, seed=1)[0]
    for m in (fused, tiered_ddr, multi):  # one process: nothing to distribute
        assert m.start(sp) is sp
        assert torch.equal(m.lookup(sp), m(sp))
    assert fused.tier_stats() == {} and sharded.tier_stats() == {}
    assert tiered_ddr.tier_stats()["lookups"] > 0 and multi.tier_stats()["lookups"] > 0
    assert set(multi.memory_bytes()) == {"fast", "ssd", "ddr"}
    # one rank of a sharded collection: whole tables as its shards, the same keys
    assert [s.key for s in sharded.shards()] == [s.key for s in fused.shards()]
    for m in (fused, tiered_ddr, multi, sharded):
        m.flush()
        m.close()


@pytest.mark.parametrize("kind", ["fused", "ddr", "ssd", "mixed"])
def test_shards_are_views_that_restore_a_single_process_module(kind, tmp_path):
    """Copy the shards out, change the tables through the views, copy the saved values back:
    lookups follow each change, and training on equals a module that was never touched."""
    opt = EmbeddingOptimizerConfig("exact_rowwise_adagrad", 0.3)
    ref = FusedEmbeddingBags(ROWS, DIMS, opt, seed=4)
    if kind == "fused":
        m = FusedEmbeddingBags(ROWS, DIMS, opt, seed=4)
    elif kind == "mixed":
        m = build_embedding_bags(ROWS, DIMS, opt, [Placement("ssd", 0.1), Placement("memory"),
                                                   Placement("ddr", 0.1)],
                                 TierConfig(min_cache_rows=1, scratch_dir=str(tmp_path)), seed=4)
    else:
        m = tiered("exact_rowwise_adagrad", kind, tmp=tmp_path)
    batches = zipf_batches(8, seed=7)
    train(ref, batches[:3])
    train(m, batches[:3])  # a warm, dirty cache
    shards = m.shards()
    assert [(s.table, s.row_offset, s.col_offset) for s in shards] == [(t, 0, 0) for t in range(3)]
    assert [s.key for s in shards] == [f"emb.t{t}.r0.c0" for t in range(3)]
    assert [tuple(s.weight.shape) for s in shards] == list(zip(ROWS, DIMS))
    assert [[tuple(x.shape) for x in s.states] for s in shards] == [[(r,)] for r in ROWS]
    saved = [(s.weight.clone(), [x.clone() for x in s.states]) for s in shards]
    probe = batches[3]
    with torch.no_grad():
        before = m.lookup(m.start(probe)).clone()
        for s in m.shards():
            s.weight.mul_(2)
            s.states[0].add_(1)
        m.flush()
        assert torch.equal(m.lookup(m.start(probe)), 2 * before)
        for s, (w, st) in zip(m.shards(), saved):
            s.weight.copy_(w)
            s.states[0].copy_(st[0])
        m.flush()
        assert torch.equal(m.lookup(m.start(probe)), before)
    train(ref, batches[3:], seed=5)
    train(m, batches[3:], seed=5)
    assert_tables_equal(ref, m)
    m.close()


def test_a_prefetch_that_does_not_fit_is_skipped_and_the_batch_still_trains():
    """Small batches (120 rows) alternate with large ones (190 rows, 60 shared with the small
    one before) in a cache of 200: the large batch's rows cannot join the small one's, so
    prefetch gives up, pinning no row, and the forward loads them itself."""
    opt = EmbeddingOptimizerConfig("exact_rowwise_adagrad", 0.3)
    perm = torch.from_numpy(np.random.default_rng(0).permutation(2000))
    batches = []
    for j in range(4):
        small, large = perm[j * 250: j * 250 + 120], perm[j * 250 + 60: j * 250 + 250]
        for ids in (small, large):
            batches.append(SparseFeatures(("a",), ids, torch.ones(1, ids.numel(), dtype=torch.int64)))
    ref = FusedEmbeddingBags([2000], [8], opt, seed=1)
    m = TieredEmbeddingBags([2000], [8], opt, seed=1, config=TierConfig(
        tier="ddr", cache_fraction=0.1, min_cache_rows=1))
    for a, b in zip(train(ref, batches), train(m, batches)):
        assert torch.equal(a, b)
    assert m.tier_stats()["prefetch_skipped"] > 0 and m.tier_stats()["evictions"] > 0
    assert_tables_equal(ref, m)
