"""Memory tiers where processes die and runs train: a process SIGKILLed in the middle of a
write-back leaves a table that opening repairs from its journal, a table larger than the RAM
budget trains from SSD in a file with anonymous memory far below its size, and a RAM budget in
the config plans tables onto SSD where train_dlrm trains them to the all-in-memory model."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from recscale.config import ConfigError, parse
from recscale.embedding import (
    EmbeddingOptimizerConfig,
    FusedEmbeddingBags,
    TierConfig,
    TieredEmbeddingBags,
    build_embedding_bags,
)
from recscale.embedding.store import FAILPOINT_ENV
from tests.unit.test_tiered import DIMS, ROOT, ROWS, assert_tables_equal, train, zipf_batches

# --- crash safety ------------------------------------------------------------------------------
CRASH_CFG = dict(tier="ssd", cache_fraction=0.1, min_cache_rows=1, prefetch=False)


def _crash_module(store_dir: str, resume: bool = False) -> TieredEmbeddingBags:
    return TieredEmbeddingBags(ROWS, DIMS, EmbeddingOptimizerConfig("exact_rowwise_adagrad", 0.3),
                               seed=4, config=TierConfig(**CRASH_CFG), store_dir=store_dir,
                               resume=resume)


def _files(store_dir) -> list[np.ndarray]:
    return [np.fromfile(os.path.join(store_dir, f"table_{t}.f32"), np.float32).reshape(r, -1)
            for t, r in enumerate(ROWS)]


def crash_child(store_dir: str, point: str, failpoint: str) -> None:
    """Run in a subprocess: train, checkpoint (flush), train on, then die in a write-back."""
    m = _crash_module(store_dir)
    batches = zipf_batches(10, seed=8)
    train(m, batches[:5], prefetch=False)
    m.flush()  # a checkpoint
    train(m, batches[5:9], prefetch=False)
    os.environ[FAILPOINT_ENV] = failpoint
    if point == "flush":
        m.flush()
    else:  # an eviction write-back inside the next batch's forward
        train(m, batches[9:], prefetch=False)
    raise SystemExit("the failpoint did not fire")


def _reference_around(store_dir: str, point: str):
    """Same run in this process: the table files just before and just after the write-back the
    child dies in."""
    m = _crash_module(store_dir)
    batches = zipf_batches(10, seed=8)
    train(m, batches[:5], prefetch=False)
    m.flush()
    train(m, batches[5:9], prefetch=False)
    before = _files(store_dir)
    written = m.store.transactions
    if point == "flush":
        m.flush()
    else:
        train(m, batches[9:], prefetch=False)
    assert m.store.transactions == written + 1  # exactly one write-back happened there
    after = _files(store_dir)
    m.close()
    return before, after


@pytest.mark.parametrize("point,failpoint", [("flush", "apply"), ("evict", "journal")])
def test_a_process_killed_mid_write_back_leaves_a_consistent_table(tmp_path, point, failpoint):
    before, after = _reference_around(str(tmp_path / "ref"), point)
    store = str(tmp_path / "crash")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    code = f"from tests.integration.test_tiered_training import crash_child; crash_child({store!r}, {point!r}, {failpoint!r})"
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == -9, proc.stderr[-2000:]  # SIGKILL, in the middle of the write-back
    raw = _files(store)
    if failpoint == "apply":  # the file itself was left with a torn row ...
        torn = [t for t, (x, a, b) in enumerate(zip(raw, before, after))
                if any(not (np.array_equal(r, p) or np.array_equal(r, q)) for r, p, q in zip(x, a, b))]
        assert torn, "the kill should have left a half-written row in the file"
    m = _crash_module(store, resume=True)  # ... which opening repairs from the journal
    assert m.store.replayed == ("replayed" if failpoint == "apply" else "dropped")
    want = after if failpoint == "apply" else before
    for t, (w, s, x) in enumerate(zip(m.split_weights(), m.split_optimizer_states(), want)):
        assert np.array_equal(w.numpy(), x[:, : DIMS[t]]), f"table {t}"
        assert np.array_equal(s[0].numpy(), x[:, DIMS[t]]), f"table {t} state"
    m.close()


# --- RAM budget --------------------------------------------------------------------------------
def _rss_anon() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    return 0


def test_a_table_larger_than_the_ram_budget_trains_from_ssd(tmp_path):
    from recscale.embedding.tier_placement import placements_from_plan
    from recscale.sharding import TableSpec, Topology, plan_sharding

    rows, dims = (400_000, 3000, 500), (64, 64, 64)
    budget = 24_000_000  # bytes of RAM for embeddings; the big table alone is 104 MB
    cfg = TierConfig(ram_budget_bytes=budget, scratch_dir=str(tmp_path), min_cache_rows=512)
    topo = Topology.preset("cpu-local", world_size=1).with_ram_budget(budget, 1e12)
    names = tuple(f"f{t}" for t in range(3))
    plan = plan_sharding([TableSpec(f"t{t}", r, d, feature_names=(names[t],))
                          for t, (r, d) in enumerate(zip(rows, dims))], topo, 512)
    assert [plan.table(f"t{t}").tier for t in range(3)] == ["ssd", "ddr", "ddr"]
    places = placements_from_plan(plan, names, "cpu", cfg)
    assert [p.kind for p in places] == ["ssd", "memory", "memory"]

    opt = EmbeddingOptimizerConfig("exact_rowwise_adagrad", 0.3)
    # the same path once on small tables first, so the lazy set-up of the kernels and the
    # allocator that the first training in a process does is not counted as the table's
    warm = TierConfig(ram_budget_bytes=budget, scratch_dir=str(tmp_path / "warm"),
                      min_cache_rows=512)
    w = build_embedding_bags((4000, 300, 50), dims, opt, places, warm, seed=4)
    train(w, zipf_batches(2, (4000, 300, 50), batch=512, seed=6))
    w.close()
    del w
    anon0 = _rss_anon()
    m = build_embedding_bags(rows, dims, opt, places, cfg, seed=4)
    batches = zipf_batches(6, rows, batch=512, seed=6)
    got = train(m, batches)
    anon = _rss_anon() - anon0
    mem = m.memory_bytes()
    table_bytes = rows[0] * (dims[0] + 1) * 4
    assert mem["ssd"] == table_bytes > budget
    assert mem["fast"] <= budget  # cache slots + their state + bookkeeping + in-memory tables
    files = list(tmp_path.glob("tiered-*/table_0.f32"))
    assert len(files) == 1 and files[0].stat().st_size == table_bytes
    if anon0:
        # anonymous memory grew by far less than the table (it sits in the file): the cache
        # (up to the 24 MB budget) and the training's own buffers, 30-55 MB here; the table
        # held in memory would add all of its 104 MB
        assert anon < 0.75 * table_bytes, (anon, table_bytes)
    assert m.tier_stats()["lookups"] > 0

    ref = FusedEmbeddingBags(rows, dims, opt, seed=4)
    for a, b in zip(train(ref, batches), got):
        assert torch.equal(a, b)
    assert_tables_equal(ref, m)
    m.close()
    assert not files[0].exists()  # the module's scratch files go with it


def test_ram_budget_in_the_config_plans_tables_onto_ssd_and_training_matches(parquet_dataset,
                                                                              tmp_path):
    """train.tiers.ram_budget_bytes -> the sharding node plans the largest tables onto SSD ->
    train_dlrm (one process) trains them there, logs tier metrics, and ends with the same model
    as the all-in-memory run."""
    from recscale.model import ModelConfig
    from recscale.runconfig import DLRMConfig, TrainConfig, plan_for_run
    from recscale.train import train_dlrm

    # the 26 tables hold 5.3 MB (dim 16, row-wise Adagrad): the largest go to SSD
    tiers = {"ram_budget_bytes": 2_000_000, "scratch_dir": str(tmp_path), "min_cache_rows": 256}
    train_d = {"batch_size_per_rank": 256, "max_steps": 8, "progress": "off", "seed": 2, "tiers": tiers}
    model_d = {"embedding_dim": 16, "bottom_mlp": [32, 16], "top_mlp": [32, 1]}
    def plan_tables(sharding, model, train):
        return plan_for_run(parquet_dataset, parse(DLRMConfig, {
            "sharding": sharding, "model": model, "train": train}, "")).to_dict()

    plan = plan_tables({"topology": "cpu-local"}, model_d, train_d)
    on_ssd = [t["name"] for t in plan["tables"] if t["shards"][0]["tier"] == "ssd"]
    assert len(on_ssd) >= 3 and plan["topology"]["ddr_bytes"] == 2_000_000
    with pytest.raises(ConfigError, match=r"train.tiers.ram_budget_bytes=0"):
        plan_tables({}, model_d, {**train_d, "tiers": {"ram_budget_bytes": 0}})

    model_cfg = parse(ModelConfig, model_d, "model")
    tiered_run = train_dlrm(parquet_dataset, model_cfg, parse(TrainConfig, train_d, "train"), plan)
    memory_run = train_dlrm(parquet_dataset, model_cfg,
                            parse(TrainConfig, {**train_d, "tiers": {}}, "train"), None)
    extra = tiered_run.result.extra
    assert extra["tiers.lookups"] > 0 and 0 < extra["tiers.hit_rate"] <= 1
    assert extra["tiers.bytes_read.ssd"] > 0 and extra["tiers.prefetch_seconds"] > 0
    a, b = tiered_run.model.state_dict(), memory_run.model.state_dict()
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
    assert not list(tmp_path.glob("tiered-*"))  # scratch files released after training


