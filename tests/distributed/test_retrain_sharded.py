"""The retrain on the sharded runtime: night 1 on 2 gloo ranks writes its sharded checkpoint;
night 2, with a vocabulary grown by the new day, warm-starts 3 ranks from it (each rank reading
its shards' rows by offset): every old row's weights and optimizer state carried bitwise, new
rows as a fresh model's, and the trained result equal to a one-process retrain from the same
warm state (the same global batches) within the sharded parity tests' tolerance."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from recscale.config import parse
from recscale.retrain import (
    DLRMRetrainConfig,
    WarmStart,
    checkpoint_source,
    find_partitions,
    prepare_partitions,
    train_warm,
)
from recscale.train.checkpoint_files import read_manifest
from tests.conftest import small_synthetic_config

pytestmark = pytest.mark.dist

B = 128  # rows per rank and step


def _cfg(tmp_path, world, **train):
    return parse(DLRMRetrainConfig, {
        "preprocess": {"ids": "vocab", "vocab": {"min_count": 1}, "row_group_size": 500},
        "model": {"embedding_dim": 8, "bottom_mlp": [16, 8], "top_mlp": [16, 1]},
        "sharding": {"local_world_size": world},
        "train": {"batch_size_per_rank": B, "progress": "off", "seed": 4,
                  "dense_optimizer": {"name": "adagrad", "learning_rate": 0.05},
                  "launch": {"world_size": world, "collective_timeout_s": 60},
                  "checkpoint": {"dir": str(tmp_path / "ck")}, **train},
        "retrain": {"work_dir": str(tmp_path / f"work{world}"),
                    "model_dir": str(tmp_path / "models")}}, "")


def _interleaved(manifest, world, steps, out):
    """The train split rewritten so that one process's batch k (world x B rows) holds exactly
    the rows the ranks read at their step k (rank r: its contiguous share's k-th B rows)."""
    t = pq.read_table(manifest["splits"]["train"]["files"])
    n = t.num_rows
    order = [r * n // world + k * B + i for k in range(steps) for r in range(world)
             for i in range(B)]
    out.mkdir()
    pq.write_table(t.take(pa.array(order)), out / "part-0.parquet", row_group_size=500)
    splits = {**manifest["splits"], "train": {"files": [str(out / "part-0.parquet")],
                                              "rows": len(order), "row_groups": 1}}
    return {**manifest, "splits": splits}


def test_night_two_on_three_ranks_grows_night_ones_two_rank_checkpoint(tmp_path):
    landing = tmp_path / "daily"
    from recscale.data.synthetic import generate_criteo_tsv

    syn = small_synthetic_config(num_rows=2400)
    generate_criteo_tsv(syn, landing / "day_00.tsv", day=0)
    generate_criteo_tsv(syn, landing / "day_01.tsv", day=1)
    parts = find_partitions(landing, "day_*.tsv")
    # (train.unknown_ids.fill gives the returned model's untrained rows the unknown row; the
    # checkpoint keeps training's state, which the warm start reads: compared below, so off)
    two = _cfg(tmp_path, 2, max_steps=3, unknown_ids={"fill": False})
    m1 = prepare_partitions(parts[:1], WarmStart("cold"), two)
    night1 = train_warm(m1, two, checkpoint_dir=str(tmp_path / "ck"))
    assert night1.result.steps == 3
    warm = checkpoint_source(tmp_path / "ck")()
    assert read_manifest(warm.checkpoint)["world_size"] == 2
    three = _cfg(tmp_path, 3, max_steps=2)
    m2 = prepare_partitions(parts[1:], warm, three)
    old, new = m1["table_sizes"], m2["table_sizes"]
    assert all(b >= a for a, b in zip(old, new)) and sum(new) > sum(old)
    # warm state only (one step at learning rate 0 would still move Adagrad's state): compare
    # the loaded model against the checkpoint's rows and a fresh model's
    from recscale.runconfig import CheckpointConfig, recipe_for
    from recscale.train.checkpoint import Checkpointer, model_fingerprint

    fresh = recipe_for(m2, three.model, three.train).build("cpu")
    loaded = recipe_for(m2, three.model, three.train).build("cpu")
    Checkpointer(CheckpointConfig(dir=str(tmp_path / "ck"), init_from=warm.checkpoint,
                                  init_grow=True), "read",
                 fingerprint=model_fingerprint(m2, three.model, three.train)
                 ).init_from_checkpoint(loaded.embeddings.shards(), loaded.dense, None)
    w1, s1 = night1.model.embeddings.split_weights(), night1.model.embeddings.split_optimizer_states()
    w, s = loaded.embeddings.split_weights(), loaded.embeddings.split_optimizer_states()
    w0, s0 = fresh.embeddings.split_weights(), fresh.embeddings.split_optimizer_states()
    for t, rows in enumerate(old):
        assert torch.equal(w[t][:rows], w1[t]) and torch.equal(w[t][rows:], w0[t][rows:])
        assert all(torch.equal(a[:rows], b) and torch.equal(a[rows:], c[rows:])
                   for a, b, c in zip(s[t], s1[t], s0[t]))
    # night 2 on 3 ranks against one process on the same global batches
    sharded = train_warm(m2, three, warm, checkpoint_dir=str(tmp_path / "ck2"))
    one = _cfg(tmp_path, 1, max_steps=2, batch_size_per_rank=3 * B)
    single = train_warm(_interleaved(m2, 3, 2, tmp_path / "inter"), one, warm,
                        checkpoint_dir=str(tmp_path / "ck1"))
    assert sharded.result.steps == single.result.steps == 2
    a, b = sharded.model.state_dict(), single.model.state_dict()
    assert a.keys() == b.keys()
    # fp32, summed in another order over 3 ranks: Adagrad's step is the gradient over its own
    # root sum of squares, so a gradient whose terms cancel carries its relative error (up to
    # about 1e-4) into the weight as lr x that per step: 2 steps x 0.05 x 1e-4 = 1e-5 (on an AMD
    # EPYC one weight of 5,744 is 1.3e-6 apart; a wrong row or step moves weights by ~lr)
    for k in a:
        np.testing.assert_allclose(a[k].numpy(), b[k].numpy(), rtol=1e-5, atol=1e-5, err_msg=k)
    assert any(not torch.equal(a[k], loaded.state_dict()[k]) for k in a)  # it trained on
