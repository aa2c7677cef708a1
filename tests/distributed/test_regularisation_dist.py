"""2 ranks on gloo: embedding weight decay (decoupled and l2), the embedding learning-rate
schedule and the weights' average (train.average: each rank averages its own pieces) under
table-, row-, column-wise and data-parallel shards equal one process."""

from __future__ import annotations

import numpy as np
import pytest

from recscale.comm.collectives import CommStats
from recscale.config import parse
from recscale.distributed import LaunchConfig, WorkerContext, launch, run_in_group, worker_entry
from recscale.embedding import FusedEmbeddingBags, table_init
from recscale.model import DLRM, ModelConfig
from recscale.runconfig import TrainConfig
from recscale.train import TrainStep
from recscale.train.average import WeightAverage
from recscale.train.runtime import build_sharded_model
from recscale.train.step import ShardedStep, make_dense_optimizer
from tests.distributed import workers as W

pytestmark = pytest.mark.dist

SCHEDULE = {"warmup_steps": 2, "schedule": "cosine", "decay_steps": 4}


def scenarios() -> list[dict]:
    out = []
    for mode in ("decoupled", "l2"):
        emb = {"name": "exact_rowwise_adagrad", "learning_rate": 0.2, "weight_decay": 0.5,
               "weight_decay_mode": mode}
        # t1, t2 row-wise, t3 replicated; then column shards (their own row-wise Adagrad)
        out.append({"name": f"row_wise/{mode}", "emb": {**emb, **SCHEDULE},
                    "kinds": ["table_wise", "row_wise", "row_wise", "data_parallel"]})
        out.append({"name": f"column_wise/{mode}", "emb": emb,
                    "kinds": ["column_wise", "table_wise", "column_wise", "row_wise"]})
    out.append({"name": "column_wise/sgd/decoupled",
                "emb": {"name": "exact_sgd", "learning_rate": 0.2, "weight_decay": 0.5},
                "kinds": ["column_wise", "table_wise", "column_wise", "row_wise"]})
    emb = {"name": "exact_rowwise_adagrad", "learning_rate": 0.2}
    out.append({"name": "row_wise/average", "emb": emb, "average": 0.7,
                "kinds": ["table_wise", "row_wise", "row_wise", "data_parallel"]})
    out.append({"name": "column_wise/average", "emb": emb, "average": 0.7,
                "kinds": ["column_wise", "table_wise", "column_wise", "row_wise"]})
    return out


def train_cfg(emb: dict) -> TrainConfig:
    return parse(TrainConfig, {"embedding_optimizer": emb,
                               "dense_optimizer": {"name": "sgd", "learning_rate": 0.1},
                               "seed": 3}, "train")


@worker_entry
def regularisation_worker(scenarios: list[dict], steps: list[list[dict]]) -> dict:
    return run_in_group(LaunchConfig(collective_timeout_s=60), _train, scenarios, steps)


def _train(ctx: WorkerContext, scenarios: list[dict], steps: list[list[dict]]) -> dict:
    out = {}
    for sc in scenarios:
        tcfg = train_cfg(sc["emb"])
        model = build_sharded_model(ctx, W.make_plan(sc["kinds"]),
                                    parse(ModelConfig, W.MODEL, "model"), tcfg, CommStats(),
                                    feature_names=W.FEATURES, num_dense=W.NUM_DENSE)
        step = ShardedStep(model, make_dense_optimizer(model.dense_parameters(),
                                                       tcfg.dense_optimizer), ctx.world_size)
        avg = WeightAverage(model, sc["average"]) if sc.get("average") else None
        for parts in steps:
            step(W.to_batch(parts[ctx.rank]))
            if avg is not None:
                avg.update()
        if avg is not None:
            avg.finish()
        tables = model.embeddings.full_tables(dst=0)
        if ctx.rank == 0:
            out[sc["name"]] = {"tables": [t.numpy() for t in tables[0]],
                               "dense": [p.detach().numpy().copy() for p in model.dense.parameters()],
                               "rate": model.embeddings.learning_rate}
    return out


def reference(emb: dict, steps, average: float | None = None
              ) -> tuple[list[np.ndarray], float, list[np.ndarray]]:
    """One process, all tables in one fused module, mean loss over each global batch;
    -> tables, embedding learning rate, dense parameters (the averages with ``average``)."""
    tcfg = train_cfg(emb)
    inits = [table_init(3, t, r, W.DIM) for t, r in enumerate(W.ROWS)]
    fused = FusedEmbeddingBags(W.ROWS, [W.DIM] * len(W.ROWS), tcfg.embedding_optimizer,
                               initial_weights=inits)
    model = DLRM(W.NUM_DENSE, len(W.ROWS), parse(ModelConfig, W.MODEL, "model"), fused, seed=3)
    step = TrainStep(model, make_dense_optimizer(model.dense_parameters(), tcfg.dense_optimizer))
    avg = WeightAverage(model, average) if average else None
    for parts in steps:
        step(W.to_batch(W.concat_parts(parts)))
        if avg is not None:
            avg.update()
    if avg is not None:
        avg.finish()
    return ([w.detach().numpy().copy() for w in fused.split_weights()], fused.learning_rate,
            [p.detach().numpy().copy() for p in model.dense.parameters()])


@pytest.fixture(scope="module")
def steps():
    return W.make_global_batches(4, seed=13)


@pytest.fixture(scope="module")
def distributed(steps):
    return launch(regularisation_worker, (scenarios(), steps),
                  LaunchConfig(world_size=2, collective_timeout_s=60))[0]


@pytest.mark.parametrize("sc", scenarios(), ids=lambda s: s["name"])
def test_sharded_weight_decay_and_schedule_equal_one_process(distributed, steps, sc):
    got = distributed[sc["name"]]
    tables, rate, dense = reference(sc["emb"], steps, sc.get("average"))
    for t, (a, b) in enumerate(zip(got["tables"], tables, strict=True)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=f"table {t}")
    for i, (a, b) in enumerate(zip(got["dense"], dense, strict=True)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=f"dense parameter {i}")
    assert got["rate"] == pytest.approx(rate)
    # the decay (the average) made a difference: without it the tables end elsewhere
    plain, _, _ = reference({k: v for k, v in sc["emb"].items() if k != "weight_decay"}, steps)
    assert not np.allclose(plain[2], tables[2], rtol=1e-4, atol=1e-5)
    if "schedule" in sc["emb"]:  # step 4: warm-up over, 3 steps into a cosine over 4
        assert rate == pytest.approx(0.2 * 0.5 * (1 + np.cos(np.pi * 3 / 4)))
