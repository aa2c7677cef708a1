"""Regularisation against reference updates: embedding weight decay (decoupled and coupled L2,
in memory and tiered), dropout in the MLPs and the DCN, learning-rate schedules of both
optimizers, dense weight decay."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from recscale.config import ConfigError, parse
from recscale.data.batch import Batch, SparseFeatures
from recscale.embedding import (
    EmbeddingOptimizerConfig,
    FusedEmbeddingBags,
    TierConfig,
    TieredEmbeddingBags,
    set_learning_rate,
)
from recscale.model import DLRM, ModelConfig
from recscale.runconfig import DenseOptimizerConfig
from recscale.train.step import TrainStep, dense_step, make_dense_optimizer, scheduled_rate

ROWS = (30, 17)
DIMS = (8, 4)
B = 6
LR = 0.1
WD = 0.3
EPS = 1e-8


def random_batch(rng: np.random.Generator, rows=ROWS, batch=B, max_len=4,
                 weighted=False) -> SparseFeatures:
    """Bags of 0..max_len-1 ids drawn from the first half of each table (repeats within the
    batch; the second half stays untouched)."""
    lengths = rng.integers(0, max_len, size=(len(rows), batch))
    vals = [rng.integers(0, r // 2, size=int(lengths[t].sum())) for t, r in enumerate(rows)]
    values = torch.from_numpy(np.concatenate(vals)).long()
    weights = (torch.from_numpy(rng.uniform(0.5, 1.5, values.numel())).float()
               if weighted else None)
    return SparseFeatures(tuple(f"f{t}" for t in range(len(rows))), values,
                          torch.from_numpy(lengths).long(), weights)


def reference_step(tables, states, sparse, grad_out, name, mode, lr, wd, eps=EPS):
    """One fused update in fp64: each touched row's summed gradient (+ wd x row for l2), the
    optimizer, then x (1 - lr wd) for decoupled. ``tables``/``states``: lists of fp64 [rows, d]
    (element-wise state) or [rows] (row-wise), updated in place."""
    T, Bn = sparse.lengths.shape
    off, col = 0, 0
    vals = sparse.values.tolist()
    w_ids = None if sparse.weights is None else sparse.weights.double().tolist()
    for t in range(T):
        d = tables[t].shape[1]
        grads: dict[int, torch.Tensor] = {}
        for b in range(Bn):
            for _ in range(int(sparse.lengths[t, b])):
                r = vals[off]
                s = 1.0 if w_ids is None else w_ids[off]
                grads[r] = grads.get(r, torch.zeros(d, dtype=torch.float64)) + s * grad_out[b, col:col + d]
                off += 1
        for r, g in grads.items():
            w = tables[t][r]
            if mode == "l2":
                g = g + wd * w
            if name == "exact_sgd":
                w = w - lr * g
            elif name == "exact_adagrad":
                states[t][r] += g * g
                w = w - lr * g / (states[t][r].sqrt() + eps)
            else:  # row-wise Adagrad: one state per row, the mean of the squared gradient
                states[t][r] += (g * g).mean()
                w = w - lr * g / (states[t][r].sqrt() + eps)
            if mode == "decoupled":
                w = w * (1.0 - lr * wd)
            tables[t][r] = w
        col += d


def fresh_states(name, tables):
    if name == "exact_sgd":
        return [None] * len(tables)
    if name == "exact_adagrad":
        return [torch.zeros_like(t) for t in tables]
    return [torch.zeros(t.shape[0], dtype=torch.float64) for t in tables]


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("mode", ["decoupled", "l2"])
@pytest.mark.parametrize("name", ["exact_sgd", "exact_rowwise_adagrad", "exact_adagrad"])
def test_embedding_weight_decay_equals_the_fp64_reference_update(name, mode, weighted):
    rng = np.random.default_rng(11)
    cfg = EmbeddingOptimizerConfig(name=name, learning_rate=LR, weight_decay=WD,
                                   weight_decay_mode=mode)
    m = FusedEmbeddingBags(ROWS, DIMS, cfg, seed=5)
    init = [w.detach().clone() for w in m.split_weights()]
    ref = [w.double().clone() for w in init]
    states = fresh_states(name, ref)
    g = torch.Generator().manual_seed(2)
    for step, lr in enumerate((LR, 0.04)):  # the second step at another rate (a schedule's)
        if step:
            set_learning_rate(m, lr)
        sparse = random_batch(rng, weighted=weighted)
        out = m(sparse)
        grad_out = torch.randn(out.shape, generator=g)
        assert out.shape == (B, sum(DIMS))
        (out * grad_out).sum().backward()
        reference_step(ref, states, sparse, grad_out.double(), name, mode, lr, WD)
    touched_any = False
    for t, (w, r, w0) in enumerate(zip(m.split_weights(), ref, init)):
        np.testing.assert_allclose(w.detach().numpy(), r.numpy(), rtol=2e-5, atol=1e-6,
                                   err_msg=f"table {t}")
        half = ROWS[t] // 2
        assert torch.equal(w[half:], w0[half:]), "rows no batch touched must not change"
        touched_any |= not torch.equal(w[:half], w0[:half])
    assert touched_any
    # the decay made a difference: the same steps without it end elsewhere
    plain = [w.double().clone() for w in init]
    rng2 = np.random.default_rng(11)
    g2 = torch.Generator().manual_seed(2)
    st2 = fresh_states(name, plain)
    for lr in (LR, 0.04):
        sparse = random_batch(rng2, weighted=weighted)
        grad_out = torch.randn((B, sum(DIMS)), generator=g2)
        reference_step(plain, st2, sparse, grad_out.double(), name, "none", lr, 0.0)
    assert not np.allclose(plain[0].numpy(), ref[0].numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["exact_rowwise_adagrad", "exact_adagrad"])
def test_adagrad_eps_of_the_gradients_size_equals_the_fp64_reference_update(name):
    """``train.embedding_optimizer.eps`` (3e-4 by default, the size of a rare row's gradient)
    reaches fbgemm's fused update: rows whose accumulated gradient is about eps move by about
    lr x gradient / eps, as the reference says, and not as with a negligible eps."""
    eps = 0.7  # the gradients here are N(0, 1) summed over a few ids: the root of a state ~1
    rng = np.random.default_rng(12)
    m = FusedEmbeddingBags(ROWS, DIMS, EmbeddingOptimizerConfig(
        name=name, learning_rate=LR, eps=eps), seed=6)
    init = [w.detach().double().clone() for w in m.split_weights()]
    ref, tiny = [w.clone() for w in init], [w.clone() for w in init]
    states, tiny_states = fresh_states(name, ref), fresh_states(name, tiny)
    g = torch.Generator().manual_seed(3)
    for _ in range(3):
        sparse = random_batch(rng)
        out = m(sparse)
        grad_out = torch.randn(out.shape, generator=g)
        (out * grad_out).sum().backward()
        reference_step(ref, states, sparse, grad_out.double(), name, "none", LR, 0.0, eps=eps)
        reference_step(tiny, tiny_states, sparse, grad_out.double(), name, "none", LR, 0.0)
    for t, (w, r, x) in enumerate(zip(m.split_weights(), ref, tiny)):
        np.testing.assert_allclose(w.detach().numpy(), r.numpy(), rtol=2e-5, atol=1e-6,
                                   err_msg=f"table {t}")
        moved, moved_tiny = (r - init[t]).abs().sum(), (x - init[t]).abs().sum()
        assert moved < 0.8 * moved_tiny, f"table {t}: eps {eps} damps no step"


def test_weight_decay_is_off_outside_training_and_without_a_backward():
    cfg = EmbeddingOptimizerConfig(name="exact_sgd", learning_rate=LR, weight_decay=WD)
    m = FusedEmbeddingBags(ROWS, DIMS, cfg, seed=5)
    before = [w.detach().clone() for w in m.split_weights()]
    sparse = random_batch(np.random.default_rng(0))
    with torch.no_grad():
        m(sparse)
    m.eval()
    m(sparse)
    m.train()
    m(sparse)  # a forward whose output is never differentiated
    assert all(torch.equal(a, b) for a, b in zip(before, m.split_weights()))


@pytest.mark.parametrize("mode", ["decoupled", "l2"])
def test_tiered_tables_decay_bitwise_like_in_memory(mode):
    """The slow tier behind a cache of a tenth of the rows: ids are cache slots there, and the
    decayed rows are written back like any updated row."""
    cfg = EmbeddingOptimizerConfig(name="exact_rowwise_adagrad", learning_rate=LR,
                                   weight_decay=WD, weight_decay_mode=mode)
    rows = (400, 300)
    mem = FusedEmbeddingBags(rows, DIMS, cfg, seed=4)
    tiered = TieredEmbeddingBags(rows, DIMS, cfg, seed=4, config=TierConfig(
        tier="ddr", cache_fraction=0.1, min_cache_rows=1))
    rng = np.random.default_rng(3)
    batches = [random_batch(rng, rows=rows, batch=8) for _ in range(6)]
    for module in (mem, tiered):
        g = torch.Generator().manual_seed(9)
        for i, b in enumerate(batches):
            if i + 1 < len(batches):
                module.prefetch(batches[i + 1])
            out = module(b)
            (out * torch.randn(out.shape, generator=g)).sum().backward()
    plain = FusedEmbeddingBags(rows, DIMS, EmbeddingOptimizerConfig(
        name="exact_rowwise_adagrad", learning_rate=LR), seed=4)
    g = torch.Generator().manual_seed(9)
    for b in batches:
        out = plain(b)
        (out * torch.randn(out.shape, generator=g)).sum().backward()
    for a, b, c in zip(mem.split_weights(), tiered.split_weights(), plain.split_weights()):
        assert torch.equal(a, b)
        assert not torch.allclose(a, c)
    tiered.close()


def test_weight_decay_config_errors_name_the_key():
    with pytest.raises(ConfigError, match=r"train.embedding_optimizer.weight_decay_mode='l1'"):
        parse(EmbeddingOptimizerConfig, {"weight_decay": 0.1, "weight_decay_mode": "l1"},
              "train.embedding_optimizer")
    with pytest.raises(ConfigError, match=r"train.embedding_optimizer.weight_decay=20"):
        parse(EmbeddingOptimizerConfig, {"learning_rate": 0.1, "weight_decay": 20},
              "train.embedding_optimizer")
    with pytest.raises(ConfigError, match=r"train.embedding_optimizer.schedule='exp'"):
        parse(EmbeddingOptimizerConfig, {"schedule": "exp"}, "train.embedding_optimizer")
    with pytest.raises(ConfigError, match=r"train.dense_optimizer.decay_gamma=0"):
        parse(DenseOptimizerConfig, {"decay_gamma": 0}, "train.dense_optimizer")
    with pytest.raises(ConfigError, match=r"model.dropout.top=1.0"):
        parse(ModelConfig, {"dropout": {"top": 1.0}}, "model")
    hf = parse(DenseOptimizerConfig, {"name": "hessian_free"}, "train.dense_optimizer")
    with pytest.raises(ConfigError, match=r"train.dense_optimizer.name='hessian_free'.*dropout"):
        hf.check_model(parse(ModelConfig, {"dropout": {"bottom": 0.1}}, "model"))


# --- dropout ----------------------------------------------------------------------------------
MODEL = {"embedding_dim": 8, "bottom_mlp": [16, 8], "top_mlp": [12, 6, 1]}


def small_model(model: dict, seed: int = 1) -> DLRM:
    cfg = parse(ModelConfig, model, "model")
    emb = FusedEmbeddingBags((20, 20), (8, 8), EmbeddingOptimizerConfig(), seed=seed)
    return DLRM(3, 2, cfg, emb, seed=seed)


def reference_logits(model: DLRM, dense, sparse, p_bottom, p_top, p_dcn):
    """The dense arch by hand, dropout drawn with F.dropout in the order the model draws."""
    arch = model.dense
    lin_b = [m for m in arch.bottom if isinstance(m, torch.nn.Linear)]
    lin_t = [m for m in arch.top if isinstance(m, torch.nn.Linear)]
    x = dense
    for i, lin in enumerate(lin_b):
        x = torch.relu(lin(x))
        if i < len(lin_b) - 1:
            x = F.dropout(x, p_bottom, training=True)
    emb = model.embeddings(sparse)
    z = arch.cross(torch.cat([x, emb], 1)) if arch.cfg.interaction == "dcn" else None
    if z is not None:
        z = F.dropout(z, p_dcn, training=True)
    else:
        feats = torch.cat([x.unsqueeze(1), emb.view(x.shape[0], 2, -1)], 1)
        inter = torch.bmm(feats, feats.transpose(1, 2)).flatten(1)
        li, lj = torch.tril_indices(3, 3, offset=-1)
        z = torch.cat([x, inter[:, li * 3 + lj]], 1)
    for i, lin in enumerate(lin_t):
        z = lin(z)
        if i < len(lin_t) - 1:
            z = F.dropout(torch.relu(z), p_top, training=True)
    return z.squeeze(1)


@pytest.mark.parametrize("interaction", ["dot", "dcn"])
def test_dropout_in_training_equals_reference_masks_and_eval_equals_no_dropout(interaction):
    spec = {**MODEL, "interaction": interaction, "dcn": {"num_layers": 2, "low_rank": 4}}
    drop = {"bottom": 0.3, "top": 0.4, "dcn": 0.5 if interaction == "dcn" else 0.0}
    model = small_model({**spec, "dropout": drop})
    plain = small_model(spec)
    rng = np.random.default_rng(4)
    dense = torch.from_numpy(rng.normal(size=(B, 3))).float()
    sparse = random_batch(rng, rows=(20, 20))
    with torch.no_grad():
        torch.manual_seed(123)
        got = model(dense, sparse)
        torch.manual_seed(123)
        want = reference_logits(model, dense, sparse, drop["bottom"], drop["top"], drop["dcn"])
        torch.manual_seed(124)
        other = model(dense, sparse)
        plain_train = plain(dense, sparse)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    assert not torch.allclose(got, other), "another seed draws other masks"
    assert not torch.allclose(got, plain_train), "dropout changed the training output"
    model.eval()
    plain.eval()
    with torch.no_grad():
        torch.manual_seed(7)
        a = model(dense, sparse)
        torch.manual_seed(8)
        b = model(dense, sparse)
        c = plain(dense, sparse)
    assert torch.equal(a, b) and torch.equal(a, c)
    assert set(model.state_dict()) == set(plain.state_dict())  # same layers: checkpoints load


# --- learning-rate schedules -------------------------------------------------------------------
def formula(schedule, step, base=1.0, warmup=4, start=2, steps=10, power=2.0, gamma=0.5):
    r = base * (min(1.0, step / warmup) if warmup else 1.0)
    t = step - 1 - start
    if t < 0 or schedule == "constant":
        return r
    f = min(t, steps) / steps
    return r * {"polynomial": (1 - f) ** power, "linear": 1 - f,
                "cosine": 0.5 * (1 + math.cos(math.pi * f)),
                "step": gamma ** (t // steps)}[schedule]


SCHEDULES = ["constant", "polynomial", "linear", "cosine", "step"]
STEPS = [1, 2, 3, 4, 5, 7, 9, 13, 14, 20, 25, 40]


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_scheduled_rate_equals_the_formula(schedule):
    for s in STEPS:
        got = scheduled_rate(1.0, s, warmup_steps=4, schedule=schedule, decay_start_step=2,
                             decay_steps=10, decay_power=2.0, decay_gamma=0.5)
        assert got == pytest.approx(formula(schedule, s), rel=1e-12, abs=1e-15), (schedule, s)
    # hand-checked points
    assert scheduled_rate(1.0, 1, warmup_steps=4) == 0.25
    assert scheduled_rate(1.0, 8, schedule="cosine", decay_steps=10, decay_start_step=2) == (
        pytest.approx(0.5))
    assert scheduled_rate(1.0, 23, schedule="step", decay_steps=10, decay_gamma=0.5) == 0.25


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_dense_optimizer_follows_the_schedule(schedule):
    cfg = parse(DenseOptimizerConfig, {
        "name": "sgd", "learning_rate": 0.2, "warmup_steps": 4, "schedule": schedule,
        "decay_start_step": 2, "decay_steps": 10, "decay_gamma": 0.5},
        "train.dense_optimizer")
    p = torch.nn.Parameter(torch.zeros(3))
    opt = make_dense_optimizer([p], cfg)
    for s in range(1, max(STEPS) + 1):
        p.grad = torch.ones(3)
        before = p.detach().clone()
        dense_step(opt)
        want = formula(schedule, s, base=0.2)
        assert opt.param_groups[0]["lr"] == pytest.approx(want, rel=1e-12, abs=1e-15)
        torch.testing.assert_close(before - p.detach(), torch.full((3,), want), rtol=1e-6,
                                   atol=1e-7)


def test_existing_dense_schedule_keys_keep_their_polynomial_decay():
    cfg = parse(DenseOptimizerConfig, {"name": "sgd", "learning_rate": 1.0, "decay_steps": 8,
                                       "decay_start_step": 1, "decay_power": 2.0},
                "train.dense_optimizer")
    p = torch.nn.Parameter(torch.zeros(1))
    opt = make_dense_optimizer([p], cfg)
    rates = []
    for _ in range(6):
        p.grad = torch.ones(1)
        dense_step(opt)
        rates.append(opt.param_groups[0]["lr"])
    assert rates == pytest.approx([1.0, 1.0, (7 / 8) ** 2, (6 / 8) ** 2, (5 / 8) ** 2,
                                   (4 / 8) ** 2])


def _batch(rng, rows=(20, 20)) -> Batch:
    sparse = random_batch(rng, rows=rows)
    return Batch(torch.from_numpy(rng.normal(size=(B, 3))).float(), sparse,
                 torch.from_numpy(rng.integers(0, 2, B)).float(), torch.arange(B))


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_embedding_rate_follows_the_schedule_and_resumes_from_the_optimizer_state(schedule):
    emb_cfg = EmbeddingOptimizerConfig(name="exact_sgd", learning_rate=0.3, warmup_steps=4,
                                       schedule=schedule, decay_start_step=2, decay_steps=10,
                                       decay_gamma=0.5)
    emb = FusedEmbeddingBags((20, 20), (8, 8), emb_cfg, seed=1)
    model = DLRM(3, 2, parse(ModelConfig, MODEL, "model"), emb, seed=1)
    opt = make_dense_optimizer(model.dense_parameters(), DenseOptimizerConfig(name="sgd"))
    step = TrainStep(model, opt)
    rng = np.random.default_rng(0)
    for s in range(1, 15):
        batch = _batch(rng)
        w0 = [w.detach().clone() for w in emb.split_weights()]
        step(batch)
        want = formula(schedule, s, base=0.3)
        assert emb.tbe.get_learning_rate() == pytest.approx(want, rel=1e-6)
        assert emb.learning_rate == pytest.approx(want, rel=1e-12)
        if s == 1:  # the fused update used it: sgd's step is lr x the row's gradient
            moved = [w0[t] - w.detach() for t, w in enumerate(emb.split_weights())]
            assert any(bool(m.abs().sum() > 0) for m in moved)
    assert opt.param_groups[0]["embedding_step"] == 14
    # a resumed run: the count comes back with the dense optimizer's state
    saved = opt.state_dict()
    emb2 = FusedEmbeddingBags((20, 20), (8, 8), emb_cfg, seed=1)
    model2 = DLRM(3, 2, parse(ModelConfig, MODEL, "model"), emb2, seed=1)
    opt2 = make_dense_optimizer(model2.dense_parameters(), DenseOptimizerConfig(name="sgd"))
    step2 = TrainStep(model2, opt2)
    opt2.load_state_dict(saved)
    step2(_batch(rng))
    assert emb2.learning_rate == pytest.approx(formula(schedule, 15, base=0.3), rel=1e-12)


def test_the_embedding_schedule_sets_the_rate_the_fused_update_uses():
    """exact_sgd, one table, a warm-up of 4: step 1 moves each touched row by lr/4 x its
    gradient (checked against the gradient reaching the pooled output)."""
    emb_cfg = EmbeddingOptimizerConfig(name="exact_sgd", learning_rate=0.4, warmup_steps=4)
    emb = FusedEmbeddingBags((20, 20), (8, 8), emb_cfg, seed=1)
    model = DLRM(3, 2, parse(ModelConfig, MODEL, "model"), emb, seed=1)
    opt = make_dense_optimizer(model.dense_parameters(), DenseOptimizerConfig(name="sgd"))
    step = TrainStep(model, opt)
    batch = _batch(np.random.default_rng(5))
    grads = {}
    def keep_grad(mod, inp, out):
        out.register_hook(lambda g: grads.setdefault("g", g.clone()))

    hook = emb.register_forward_hook(keep_grad)
    w0 = [w.detach().clone().double() for w in emb.split_weights()]
    step(batch)
    hook.remove()
    ref = [w.clone() for w in w0]
    reference_step(ref, [None, None], batch.sparse, grads["g"].double(), "exact_sgd", "none",
                   0.1, 0.0)
    for w, r in zip(emb.split_weights(), ref):
        np.testing.assert_allclose(w.detach().numpy(), r.numpy(), rtol=1e-5, atol=1e-7)


def test_dense_weight_decay_is_the_coupled_l2_of_the_dense_optimizer():
    cfg = parse(DenseOptimizerConfig, {"name": "sgd", "learning_rate": 0.1,
                                       "weight_decay": 0.5}, "train.dense_optimizer")
    g = torch.Generator().manual_seed(0)
    p = torch.nn.Parameter(torch.randn(5, generator=g))
    grad = torch.randn(5, generator=g)
    w0 = p.detach().double().clone()
    opt = make_dense_optimizer([p], cfg)
    p.grad = grad.clone()
    dense_step(opt)
    want = w0 - 0.1 * (grad.double() + 0.5 * w0)
    np.testing.assert_allclose(p.detach().numpy(), want.numpy(), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("steps, max_steps, horizon", [
    (782, None, 782 / 8),  # the default's epochs: ~0.99
    (157, None, 157 / 8),  # ratings': ~0.95
    (32, None, 4.0),       # conf/test's one epoch
    (3125, None, 100.0),   # mlperf_dcnv2's: the longest horizon
    (8, None, 2.0),        # the shortest
    (782, 40, 5.0),        # max_steps shorter than the epoch
    (None, None, 100.0),   # neither known
])
def test_auto_decay_averages_over_an_eighth_of_an_epoch_at_most_100_steps(steps, max_steps,
                                                                         horizon):
    from recscale.train.average import auto_decay, resolve_decay

    assert auto_decay(steps, max_steps) == pytest.approx(1 - 1 / horizon, abs=1e-12)
    assert resolve_decay("auto", steps, max_steps) == auto_decay(steps, max_steps)
    assert resolve_decay(0.9, steps, max_steps) == 0.9 and resolve_decay(None, steps) is None


def test_average_decay_accepts_auto_a_number_or_null_and_names_the_key_otherwise():
    from recscale.runconfig import TrainConfig

    for ok in ("auto", 0.5, 0.9999, None):
        assert parse(TrainConfig, {"average": {"decay": ok}}, "train").average.decay == ok
    for bad in ("often", 0.0, 1.0, -0.5, True):
        with pytest.raises(ConfigError, match=r"train\.average\.decay"):
            parse(TrainConfig, {"average": {"decay": bad}}, "train")
