import importlib
import re

import numpy as np
import pytest
import torch

from recscale.config import ConfigError, parse
from recscale.data.batch import SparseFeatures
from recscale.embedding import EmbeddingOptimizerConfig, FusedEmbeddingBags, table_init
from recscale.model import ModelConfig, build_dlrm
from recscale.runconfig import TrainConfig
from recscale.train import TrainStep
from recscale.train.step import make_dense_optimizer


def random_sparse(rng, rows, batch, max_len=3):
    lengths = rng.integers(0, max_len + 1, size=(len(rows), batch))
    values = np.concatenate([rng.integers(0, r, size=int(lengths[t].sum()))
                             for t, r in enumerate(rows)])
    keys = tuple(f"f{t}" for t in range(len(rows)))
    return SparseFeatures(keys, torch.from_numpy(values), torch.from_numpy(lengths))


def reference_pool(weights, sparse):
    """Plain-torch sum pooling in fp64, one table per feature."""
    T, B = sparse.lengths.shape
    off = sparse.offsets()
    out = []
    for t in range(T):
        vals = sparse.values[off[t * B]: off[(t + 1) * B]]
        out.append(torch.nn.functional.embedding_bag(
            vals, weights[t].double(), off[t * B: (t + 1) * B] - off[t * B], mode="sum"))
    return torch.cat(out, dim=1)


def test_fused_embedding_bags_pool_like_the_reference():
    rng = np.random.default_rng(0)
    rows, dims = [50, 7, 300], [8, 8, 8]
    emb = FusedEmbeddingBags(rows, dims, EmbeddingOptimizerConfig(name="exact_sgd"), seed=5)
    for t, w in enumerate(emb.split_weights()):
        assert torch.equal(w, table_init(5, t, rows[t], dims[t]))
    sp = random_sparse(rng, rows, 64)
    got = emb(sp)
    want = reference_pool(emb.split_weights(), sp)
    torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("opt", ["exact_sgd", "exact_rowwise_adagrad", "exact_adagrad"])
def test_fused_update_equals_the_optimizer_applied_to_the_dense_gradient(opt):
    rng = np.random.default_rng(1)
    rows, dims = [40, 25], [8, 8]
    cfg = EmbeddingOptimizerConfig(name=opt, learning_rate=0.3, eps=1e-6)
    emb = FusedEmbeddingBags(rows, dims, cfg, seed=2)
    w0 = [w.detach().clone().double().requires_grad_(True) for w in emb.split_weights()]
    sp = random_sparse(rng, rows, 32)
    upstream = torch.from_numpy(rng.normal(size=(32, 16)))
    (emb(sp).double() * upstream).sum().backward()
    (reference_pool(w0, sp) * upstream).sum().backward()
    for t in range(2):
        g = w0[t].grad
        if opt == "exact_sgd":
            want = w0[t] - 0.3 * g
        elif opt == "exact_rowwise_adagrad":
            state = (g * g).mean(dim=1, keepdim=True)
            want = w0[t] - 0.3 * g / (state.sqrt() + 1e-6)
        else:
            want = w0[t] - 0.3 * g / ((g * g).sqrt() + 1e-6)
        torch.testing.assert_close(emb.split_weights()[t].double(), want.detach(), rtol=1e-5, atol=1e-6)


def _tiny_model(seed=0, precision="fp32", interaction="dot", opt="exact_rowwise_adagrad"):
    cfg = ModelConfig(embedding_dim=8, bottom_mlp=(16, 8), top_mlp=(16, 1), interaction=interaction,
                      dense_precision=precision)
    return build_dlrm(cfg, [30, 20, 10], 13, EmbeddingOptimizerConfig(name=opt), seed=seed)


def _batch(rng, b=64):
    from recscale.data.batch import Batch

    return Batch(torch.from_numpy(rng.normal(size=(b, 13)).astype(np.float32)),
                 random_sparse(rng, [30, 20, 10], b, max_len=1),
                 torch.from_numpy(rng.integers(0, 2, b).astype(np.float32)),
                 torch.arange(b))


@pytest.mark.parametrize("interaction", ["dot", "cat"])
def test_dlrm_forward_matches_a_hand_written_reference(interaction):
    rng = np.random.default_rng(2)
    model = _tiny_model(interaction=interaction)
    batch = _batch(rng)
    got = model(batch.dense, batch.sparse)
    x = model.bottom(batch.dense)
    emb = reference_pool(model.embeddings.split_weights(), batch.sparse).float()
    if interaction == "dot":
        feats = [x] + list(emb.split(8, dim=1))
        pairs = [(feats[i] * feats[j]).sum(1, keepdim=True) for i in range(4) for j in range(i)]
        z = torch.cat([x] + pairs, dim=1)
    else:
        z = torch.cat([x, emb], dim=1)
    torch.testing.assert_close(got, model.top(z).squeeze(1), rtol=1e-5, atol=1e-6)


def test_training_is_bitwise_deterministic_for_a_seed():
    def run(seed):
        model = _tiny_model(seed=seed)
        step = TrainStep(model, make_dense_optimizer(model.dense_parameters(),
                                                     TrainConfig().dense_optimizer))
        rng = np.random.default_rng(9)
        for _ in range(5):
            step(_batch(rng))
        return model.state_dict()

    a, b, c = run(0), run(0), run(1)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_dense_optimizer_never_sees_embedding_weights():
    model = _tiny_model()
    dense = {id(p) for p in model.dense_parameters()}
    assert all(id(p) not in dense for p in model.embeddings.parameters())
    assert len(dense) == sum(1 for _ in model.bottom.parameters()) + sum(1 for _ in model.top.parameters())


def test_bf16_dense_layers_train_without_nans():
    rng = np.random.default_rng(3)
    model = _tiny_model(precision="bf16")
    step = TrainStep(model, make_dense_optimizer(model.dense_parameters(), TrainConfig().dense_optimizer))
    losses = [float(step(_batch(rng))) for _ in range(5)]
    assert all(np.isfinite(losses))
    assert model.top[0].weight.dtype == torch.float32  # master weights stay fp32


def test_state_dict_loads_with_weights_only(tmp_path):
    model = _tiny_model(seed=4)
    torch.save(model.state_dict(), tmp_path / "m.pt")
    sd = torch.load(tmp_path / "m.pt", weights_only=True)
    other = _tiny_model(seed=5)
    other.load_state_dict(sd)
    rng = np.random.default_rng(0)
    b = _batch(rng)
    assert torch.equal(model(b.dense, b.sparse), other(b.dense, b.sparse))


@pytest.mark.parametrize(
    "block,params,match",
    [
        ("train", {"batch_size_per_rank": 0},
         r"train\.batch_size_per_rank=0 is not allowed: expected a positive integer"),
        ("train", {"embedding_optimizer": {"name": "adam"}},
         r"train\.embedding_optimizer\.name='adam' is not allowed: expected one of 'exact_rowwise_adagrad'"),
        ("train", {"dense_optimizer": {"name": "lbfgs"}}, r"train\.dense_optimizer\.name='lbfgs'"),
        ("model", {"embedding_dim": 32}, r"model\.bottom_mlp=.* last width equal to model\.embedding_dim=32"),
        ("model", {"top_mlp": [64, 2]}, r"model\.top_mlp"),
        ("model", {"interaction": "cross"}, r"model\.interaction='cross'"),
        ("train", {"batchsize": 10}, r"unknown key train\.batchsize \(did you mean 'batch_size_per_rank'\?\); allowed keys under "
         r"train: average, batch_size_per_rank"),
        ("train", {"batch_size_per_rank": "big"},
         r"train\.batch_size_per_rank='big' is not allowed: expected an integer"),
    ],
)
def test_bad_parameters_fail_with_the_key_named(block, params, match):
    cls = TrainConfig if block == "train" else ModelConfig
    with pytest.raises(ConfigError, match=match):
        parse(cls, params, block)


def test_bad_parameters_fail_in_the_node_before_any_training(monkeypatch):
    from recscale.pipelines import common
    from recscale.pipelines.training import nodes

    called = []
    monkeypatch.setattr(nodes, "train_dlrm", lambda *a, **k: called.append(a))
    with pytest.raises(ConfigError, match=r"train\.batch_size_per_rank=0"):
        common.parse_dlrm_config({}, "criteo", {}, {}, {}, {}, {"batch_size_per_rank": 0}, {})
    assert not called


def test_mismatched_fbgemm_names_both_versions_and_the_working_pair(monkeypatch):
    import builtins

    import recscale

    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name == "fbgemm_gpu":
            raise OSError("undefined symbol: _ZN3c10fake")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    with pytest.raises(recscale.IncompatibleFbgemmError) as err:
        recscale.check_fbgemm()
    msg = str(err.value)
    assert f"torch {torch.__version__}" in msg and "fbgemm-gpu-cpu 1.8.0" in msg
    assert "torch==2.13.0 with fbgemm-gpu-cpu==1.8.0" in msg and "undefined symbol" in msg
    monkeypatch.setattr(builtins, "__import__", real_import)
    importlib.reload(recscale)
    assert recscale.check_fbgemm() == "1.8.0"


def test_embedding_weight_decay_works_on_the_cpu_where_fbgemm_ignores_it():
    """fbgemm's CPU kernels ignore weight decay; recscale applies it (decoupled by default): a
    zero gradient leaves exactly the decay on the looked-up row (tests/unit/test_regularisation.py
    checks every optimizer and mode against an fp64 reference)."""
    from recscale.data.batch import SparseFeatures
    from recscale.embedding import EmbeddingOptimizerConfig, FusedEmbeddingBags

    m = FusedEmbeddingBags([10], [4], EmbeddingOptimizerConfig("exact_sgd", 0.1, weight_decay=0.5))
    w0 = m.split_weights()[0].detach().clone()
    out = m(SparseFeatures(("f",), torch.tensor([3]), torch.tensor([[1]])))
    (out * 0).sum().backward()
    w = m.split_weights()[0]
    torch.testing.assert_close(w[3], w0[3] * (1 - 0.1 * 0.5))
    assert torch.equal(w[:3], w0[:3]) and torch.equal(w[4:], w0[4:])


def test_to_cpu_model_copies_tables_optimizer_state_and_dense_layers():
    """What a CUDA-trained model goes through (fbgemm keeps its tables in device-specific buffers,
    so state_dicts do not load across devices): here CPU -> CPU, after some training."""
    from recscale.model import to_cpu_model
    from recscale.runconfig import recipe_for

    manifest = {"table_sizes": [50, 70, 30]}
    mcfg = parse(ModelConfig, {"embedding_dim": 8, "bottom_mlp": [16, 8], "top_mlp": [16, 1]}, "model")
    tcfg = parse(TrainConfig, {"seed": 4}, "train")
    model = build_dlrm(mcfg, manifest["table_sizes"], 13, tcfg.embedding_optimizer, seed=4)
    g = torch.Generator().manual_seed(1)
    lengths = torch.randint(0, 3, (3, 32), generator=g)
    values = torch.randint(0, 30, (int(lengths.sum()),), generator=g)
    sp = SparseFeatures(("a", "b", "c"), values, lengths)
    opt = make_dense_optimizer(model.dense_parameters(), tcfg.dense_optimizer)
    step = TrainStep(model, opt)
    from recscale.data.batch import Batch
    for _ in range(3):
        step(Batch(torch.randn(32, 13, generator=g), sp, torch.randint(0, 2, (32,), generator=g).float(),
                   torch.arange(32)))
    copy = to_cpu_model(model, recipe_for(manifest, mcfg, tcfg))
    a, b = model.state_dict(), copy.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_bf16_dense_layers_on_a_cpu_without_bf16_units_are_named_at_the_start_of_a_run(
        parquet_dataset, monkeypatch, caplog):
    """A forced "no bf16" capability: the run warns before it trains, naming the key, the CPU's
    capability and the rates it measured; with bf16 units, or in fp32, it says nothing."""
    import logging

    from recscale.model import precision
    from recscale.train import train_dlrm

    mcfg = parse(ModelConfig, {"embedding_dim": 8, "bottom_mlp": [16, 8], "top_mlp": [16, 1],
                               "dense_precision": "bf16"}, "model")
    tcfg = parse(TrainConfig, {"batch_size_per_rank": 256, "max_steps": 2, "progress": "off"},
                 "train")
    monkeypatch.setattr(precision, "cpu_bf16_units", lambda: ("AVX2", False))
    with caplog.at_level(logging.WARNING, logger="recscale.train.entry"):
        train_dlrm(parquet_dataset, mcfg, tcfg)
    said = [r.getMessage() for r in caplog.records if "dense_precision" in r.getMessage()]
    assert len(said) == 1, said
    assert re.search(r"model\.dense_precision='bf16' on a CPU without bf16 units \(torch's CPU "
                     r"capability AVX2; .* ran at [0-9.]+ GFLOP/s here against [0-9.]+ in fp32",
                     said[0]), said[0]
    # the warning comes before the first step
    first_step = next((i for i, r in enumerate(caplog.records) if "trained" in r.getMessage()),
                      len(caplog.records))
    assert caplog.records.index(next(r for r in caplog.records
                                     if "dense_precision" in r.getMessage())) < first_step
    caplog.clear()
    monkeypatch.setattr(precision, "cpu_bf16_units", lambda: ("AVX512", True))
    assert precision.bf16_warning("bf16") is None
    monkeypatch.setattr(precision, "cpu_bf16_units", lambda: ("AVX2", False))
    assert precision.bf16_warning("fp32") is None and precision.bf16_warning("bf16", "cuda") is None
