"""train.reinit_embeddings: every epoch after the first starts the tables (and their fused
optimizer state) from a freshly built model's values while the dense layers go on; once per
epoch, never again in a resumed epoch, the same in one process, on the SSD tier and on 2 ranks."""


import pytest
import torch

import recscale.train.loop as loop
from recscale.config import parse
from recscale.embedding import EmbeddingOptimizerConfig
from recscale.embedding.reset import reset_tables
from recscale.model import ModelConfig
from recscale.model.convert import ModelRecipe
from recscale.runconfig import DLRMConfig, TrainConfig, plan_for_run, recipe_for
from recscale.train import train_dlrm
from tests.distributed.workers import mixed_plan

SMALL = {"embedding_dim": 16, "bottom_mlp": [32, 16], "top_mlp": [32, 1]}
STEPS = 38  # one epoch: 56,000 train rows / 1,500


def _cfg(**train):
    base = {"batch_size_per_rank": 1500, "progress": "off", "epochs": 3, "seed": 5,
            "reinit_embeddings": True, "unknown_ids": {"fill": False},
            "embedding_optimizer": {"name": "exact_rowwise_adagrad", "learning_rate": 0.2}}
    base.update(train)
    return parse(TrainConfig, base, "train")


def _train(manifest, plan=None, **train):
    return train_dlrm(manifest, parse(ModelConfig, SMALL, "model"), _cfg(**train), plan=plan)


def _fresh(manifest, **train):
    """The model a run of these settings starts from, built on its own."""
    return recipe_for(manifest, parse(ModelConfig, SMALL, "model"), _cfg(**train)).build()


def _tables(emb):
    return [w.detach().clone() for w in emb.split_weights()]


@pytest.fixture
def resets(monkeypatch):
    """Each reset's step, and the tables and optimizer state right after it."""
    seen = []
    real = loop.reset_tables

    def spy(emb, seed, epoch=None):
        n = real(emb, seed, epoch)
        seen.append((_tables(emb), [[s.clone() for s in st]
                                    for st in emb.split_optimizer_states()]))
        return n

    monkeypatch.setattr(loop, "reset_tables", spy)
    return seen


def test_each_later_epoch_starts_from_the_fresh_models_tables_and_empty_state(
        parquet_dataset, resets):
    out = _train(parquet_dataset)
    assert out.result.steps == 3 * STEPS and len(resets) == 2  # epochs 2 and 3, not the first
    init = _tables(_fresh(parquet_dataset).embeddings)
    for tables, states in resets:
        assert all(torch.equal(a, b) for a, b in zip(tables, init))
        assert all(not s.any() for st in states for s in st)
    # and the dense layers went on: they are not the fresh model's
    assert not torch.equal(out.model.top[0].weight, _fresh(parquet_dataset).top[0].weight)
    # off: the tables go on from where epoch 1 left them, to another model
    plain = _train(parquet_dataset, reinit_embeddings=False)
    assert not all(torch.equal(a, b) for a, b in zip(_tables(plain.model.embeddings),
                                                    _tables(out.model.embeddings)))


def test_a_run_resumed_in_epoch_two_resets_nothing_again_and_ends_bitwise_equal(
        parquet_dataset, tmp_path, resets):
    whole = _train(parquet_dataset, epochs=2)
    ckpt = {"dir": str(tmp_path), "every_steps": 10, "keep_last": 1}
    _train(parquet_dataset, epochs=2, checkpoint=ckpt, max_steps=STEPS + 12)  # stops in epoch 2
    resets.clear()
    resumed = _train(parquet_dataset, epochs=2, checkpoint={**ckpt, "resume": "latest"})
    assert resumed.result.extra["resumed"] == 1 and resets == []
    sa, sb = whole.model.state_dict(), resumed.model.state_dict()
    assert [k for k in sa if not torch.equal(sa[k], sb[k])] == []


def test_tables_on_ssd_reset_to_the_in_memory_runs_values(parquet_dataset, tmp_path):
    tiers = {"ram_budget_bytes": 2_000_000, "scratch_dir": str(tmp_path), "min_cache_rows": 256}
    train = {"batch_size_per_rank": 256, "epochs": 2, "seed": 5, "reinit_embeddings": True,
             "progress": "off", "unknown_ids": {"fill": False},
             "embedding_optimizer": {"name": "exact_rowwise_adagrad", "learning_rate": 0.2}}
    plan = plan_for_run(parquet_dataset, parse(DLRMConfig, {
        "sharding": {"topology": "cpu-local"}, "model": SMALL,
        "train": {**train, "tiers": tiers}}, "")).to_dict()
    assert any(t["shards"][0]["tier"] == "ssd" for t in plan["tables"])
    tiered = train_dlrm(parquet_dataset, parse(ModelConfig, SMALL, "model"),
                        parse(TrainConfig, {**train, "tiers": tiers}, "train"), plan)
    memory = _train(parquet_dataset, epochs=2, batch_size_per_rank=256)
    sa, sb = tiered.model.state_dict(), memory.model.state_dict()
    assert [k for k in sa if not torch.equal(sa[k], sb[k])] == []


def test_two_ranks_reset_every_kind_of_piece_to_the_fresh_builds_values(parquet_dataset):
    """Stopped one step into epoch 2: with the reset, every row that step did not touch holds
    its fresh value exactly, on every kind of piece; without it, the rows epoch 1 touched keep
    theirs. (Ranks read contiguous halves of the split, so a 2-rank run's batches are not one
    process's: the run is compared with the fresh build and with itself.)"""
    kinds = ["row_wise", "column_wise", "data_parallel", "table_wise"]  # every kind of piece
    plan = mixed_plan(parquet_dataset, kinds, 750)
    two = {"batch_size_per_rank": 750, "epochs": 2, "max_steps": STEPS + 1,
           "launch": {"world_size": 2}}
    reset = _train(parquet_dataset, plan=plan, **two).model.embeddings.split_weights()
    kept = _train(parquet_dataset, plan=plan, **two,
                  reinit_embeddings=False).model.embeddings.split_weights()
    fresh = _fresh(parquet_dataset).embeddings.split_weights()
    back = {k: 0 for k in kinds}
    for t, (r, k, f) in enumerate(zip(reset, kept, fresh)):
        at_init_r, at_init_k = (r == f).all(1), (k == f).all(1)
        # the rows away from their fresh value after the reset are those epoch 2's one step
        # touched: a subset of those epoch 1 touched, which kept theirs without it
        assert not (at_init_k & ~at_init_r).any(), f"table {t}"
        back[kinds[t % len(kinds)]] += int(at_init_r.sum() - at_init_k.sum())
    assert all(n > 0 for n in back.values()), back


def test_shared_tables_behind_the_features_reset_like_a_fresh_build(seed):
    """Features sharing a table (the FeatureBags wrapper a schema of your own builds)."""
    recipe = ModelRecipe(parse(ModelConfig, SMALL, "model"), (50, 30), 2,
                         EmbeddingOptimizerConfig(name="exact_rowwise_adagrad"), seed=seed,
                         feature_tables=(0, 0, 1))
    model, fresh = recipe.build(), recipe.build()
    assert type(model.embeddings).__name__ == "FeatureBags"
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for w in model.embeddings.split_weights():
            w.add_(torch.randn(w.shape, generator=g))
        for st in model.embeddings.split_optimizer_states():
            for x in st:
                x.add_(1.0)
    assert reset_tables(model.embeddings, seed) == 80
    assert all(torch.equal(a, b) for a, b in zip(model.embeddings.split_weights(),
                                                fresh.embeddings.split_weights()))
    assert all(not x.any() for st in model.embeddings.split_optimizer_states() for x in st)


def test_early_stopping_judges_a_reset_epoch_at_its_end(parquet_dataset):
    out = _train(parquet_dataset, epochs=4, validation={"enabled": True, "per_epoch": 4},
                 early_stopping={"enabled": True, "patience": 1})
    auc = {p["step"]: p["value"] for p in out.result.history["validation.auc"]}
    first = min(s for s in auc if s > STEPS)
    assert auc[first] < auc[STEPS]  # fresh tables: epoch 2's first point is worse than epoch 1's end
    stop = out.result.extra["stopped_early_at"]
    assert out.result.steps >= 2 * STEPS and stop % STEPS == 0  # never stopped inside an epoch
    # without the reset the same patience stops at the first point that does not improve
    plain = _train(parquet_dataset, epochs=4, reinit_embeddings=False,
                   validation={"enabled": True, "per_epoch": 4},
                   early_stopping={"enabled": True, "patience": 1})
    assert plain.result.extra["stopped_early_at"] % STEPS != 0


def test_a_reset_epochs_points_before_its_end_count_nothing_towards_the_patience(parquet_dataset):
    out = _train(parquet_dataset, epochs=5, validation={"enabled": True, "per_epoch": 4},
                 early_stopping={"enabled": True, "patience": 2})
    points = [(p["step"], p["value"]) for p in out.result.history["validation.auc"]]
    # the rule replayed on the recorded points: any point may be the best, but after epoch 1 only
    # an epoch's end counts when it does not improve
    best, bad, stop = None, 0, 0
    for step, v in points:
        if best is None or v > best:
            best, bad = v, 0
        elif step <= STEPS or step % STEPS == 0:
            bad += 1
        if bad >= 2 and step % STEPS == 0 or bad >= 2 and step <= STEPS:
            stop = step
            break
    assert out.result.extra["stopped_early_at"] == stop
    assert out.result.steps == (stop or 5 * STEPS) and points[-1][0] == out.result.steps
    # and mid-epoch points that did not improve came after the best (so the rule was exercised)
    assert any(step % STEPS and step > STEPS and v <= max(x for s, x in points if s < step)
               for step, v in points)
