"""Smoke test for the trimmed fbgemm_gpu 1.6.0 on one CUDA GPU (runs on CPU too, HOST location only).

Checks, against a float64 reference computed in plain torch:
  * SplitTableBatchedEmbeddingBagsCodegen forward + backward (fused optimizer), pooling SUM,
    optimizers EXACT_SGD / EXACT_ROWWISE_ADAGRAD (and EXACT_ADAGRAD, also used by recscale),
    locations DEVICE and MANAGED_CACHING with LRU and LFU caches (unweighted and weighted bags);
  * torch.ops.fbgemm.asynchronous_complete_cumsum / permute_2D_sparse_data /
    block_bucketize_sparse_features / permute_1D_sparse_data (CUDA result == CPU result == reference).
Prints one line per case and 'ALL OK' at the end; exits 1 on the first mismatch summary.
"""
import os
import sys
import time

import torch

t0 = time.time()
import fbgemm_gpu  # noqa: E402
from fbgemm_gpu.split_embedding_configs import EmbOptimType as OptimType  # noqa: E402
from fbgemm_gpu.split_table_batched_embeddings_ops_common import (  # noqa: E402
    CacheAlgorithm,
    EmbeddingLocation,
    PoolingMode,
)
from fbgemm_gpu.split_table_batched_embeddings_ops_training import (  # noqa: E402
    ComputeDevice,
    SplitTableBatchedEmbeddingBagsCodegen,
)

print("torch", torch.__version__, "fbgemm_gpu", fbgemm_gpu.__version__, "import_s", round(time.time() - t0, 1),
      "CUDA_MODULE_LOADING", os.environ.get("CUDA_MODULE_LOADING"), flush=True)
CUDA = torch.cuda.is_available()
if CUDA:
    print("device", torch.cuda.get_device_name(0), torch.cuda.get_device_capability(0), flush=True)
dev = torch.device("cuda" if CUDA else "cpu")
failures = []


def check(name, ok, detail=""):
    print(("ok   " if ok else "FAIL ") + name + (" " + detail if detail else ""), flush=True)
    if not ok:
        failures.append(name)


# ---------------------------------------------------------------- TBE
ROWS, DIMS, B, LR, EPS = [1000, 300, 2000], [16, 32, 64], 64, 0.05, 1e-8


def make_batch(g, weighted):
    idx, lens = [], []
    for r in ROWS:
        for _ in range(B):
            n = int(torch.randint(0, 6, (1,), generator=g))
            lens.append(n)
            idx.append(torch.randint(0, r, (n,), generator=g))
    indices = torch.cat(idx).long()
    offsets = torch.tensor([0] + lens).cumsum(0).long()
    psw = torch.rand(indices.numel(), generator=g) if weighted else None
    return indices, offsets, psw


def reference(ws, states, indices, offsets, psw, grad_out, opt):
    """float64: pooled output and the weights/state after one exact fused step."""
    outs, new_ws, new_states = [], [], []
    col = 0
    for t, (w, D) in enumerate(zip(ws, DIMS)):
        w = w.double()
        out = torch.zeros(B, D, dtype=torch.float64)
        grad = torch.zeros_like(w)
        gt = grad_out[:, col:col + D].double()
        for b in range(B):
            s, e = int(offsets[t * B + b]), int(offsets[t * B + b + 1])
            for j in range(s, e):
                r = int(indices[j])
                c = float(psw[j]) if psw is not None else 1.0
                out[b] += c * w[r]
                grad[r] += c * gt[b]
        touched = torch.zeros(w.shape[0], dtype=torch.bool)
        touched[indices[int(offsets[t * B]):int(offsets[(t + 1) * B])]] = True
        st = states[t].double() if states is not None else None
        if opt == OptimType.EXACT_SGD:
            w = w - LR * grad
        elif opt == OptimType.EXACT_ROWWISE_ADAGRAD:
            st = st + torch.where(touched, (grad * grad).mean(1), torch.zeros_like(st))
            w = torch.where(touched[:, None], w - LR * grad / (st.sqrt() + EPS)[:, None], w)
        elif opt == OptimType.EXACT_ADAGRAD:
            st = st + torch.where(touched[:, None], grad * grad, torch.zeros_like(st))
            w = torch.where(touched[:, None], w - LR * grad / (st.sqrt() + EPS), w)
        outs.append(out)
        new_ws.append(w)
        new_states.append(st)
        col += D
    return torch.cat(outs, 1), new_ws, new_states


def run_tbe(opt, loc, cache_alg, weighted, steps=3):
    compute = ComputeDevice.CUDA if CUDA else ComputeDevice.CPU
    tbe = SplitTableBatchedEmbeddingBagsCodegen(
        [(r, d, loc, compute) for r, d in zip(ROWS, DIMS)],
        optimizer=opt, learning_rate=LR, eps=EPS, pooling_mode=PoolingMode.SUM,
        cache_algorithm=cache_alg, cache_load_factor=0.2, device=dev)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for w in tbe.split_embedding_weights():
            w.copy_(torch.rand(w.shape, generator=g) - 0.5)
    worst = 0.0
    for _step in range(steps):
        if loc == EmbeddingLocation.MANAGED_CACHING:
            tbe.flush()
        ws = [w.detach().cpu().clone() for w in tbe.split_embedding_weights()]
        states = None
        if opt != OptimType.EXACT_SGD:
            states = [s[0].detach().cpu().clone().reshape(w.shape[0], -1).squeeze(1)
                      if opt == OptimType.EXACT_ROWWISE_ADAGRAD else s[0].detach().cpu().clone()
                      for s, w in zip(tbe.split_optimizer_states(), ws)]
        indices, offsets, psw = make_batch(g, weighted)
        grad_out = torch.randn(B, sum(DIMS), generator=g)
        out = tbe(indices.to(dev), offsets.to(dev),
                  per_sample_weights=psw.to(dev) if psw is not None else None)
        out.backward(grad_out.to(dev))
        if CUDA:
            torch.cuda.synchronize()
        ref_out, ref_ws, ref_states = reference(ws, states, indices, offsets, psw, grad_out, opt)
        if loc == EmbeddingLocation.MANAGED_CACHING:
            tbe.flush()
        err_out = (out.detach().cpu().double() - ref_out).abs().max().item()
        err_w = max((w.detach().cpu().double() - rw).abs().max().item()
                    for w, rw in zip(tbe.split_embedding_weights(), ref_ws))
        worst = max(worst, err_out, err_w)
    return worst


cases = []
locs = [EmbeddingLocation.DEVICE, EmbeddingLocation.MANAGED_CACHING] if CUDA else [EmbeddingLocation.HOST]
for opt in [OptimType.EXACT_SGD, OptimType.EXACT_ROWWISE_ADAGRAD, OptimType.EXACT_ADAGRAD]:
    for loc in locs:
        algs = [CacheAlgorithm.LRU, CacheAlgorithm.LFU] if loc == EmbeddingLocation.MANAGED_CACHING else [CacheAlgorithm.LRU]
        for alg in algs:
            for weighted in (False, True):
                cases.append((opt, loc, alg, weighted))
for opt, loc, alg, weighted in cases:
    name = f"tbe {opt.name} {loc.name} {alg.name if loc == EmbeddingLocation.MANAGED_CACHING else ''} weighted={weighted}"
    try:
        t = time.time()
        err = run_tbe(opt, loc, alg, weighted)
        check(name, err < 1e-4, f"max_abs_err={err:.2e} {time.time() - t:.1f}s")
    except Exception as e:  # noqa: BLE001
        check(name, False, f"{type(e).__name__}: {str(e)[:300]}")

# ---------------------------------------------------------------- sparse ops
fb = torch.ops.fbgemm
g = torch.Generator().manual_seed(1)
try:
    x = torch.randint(0, 10, (1000,), generator=g)
    for dt in (torch.int32, torch.int64):
        got = fb.asynchronous_complete_cumsum(x.to(dt).to(dev)).cpu()
        want = torch.cat([torch.zeros(1, dtype=torch.int64), x.cumsum(0)])
        check(f"asynchronous_complete_cumsum {dt}", torch.equal(got.long(), want))
except Exception as e:  # noqa: BLE001
    check("asynchronous_complete_cumsum", False, f"{type(e).__name__}: {str(e)[:300]}")

try:
    T, Bs = 5, 16
    lengths = torch.randint(0, 4, (T, Bs), generator=g).int()
    values = torch.randint(0, 1000, (int(lengths.sum()),), generator=g).long()
    perm = torch.tensor([3, 0, 4, 1]).int()
    res = [fb.permute_2D_sparse_data(perm.to(d), lengths.to(d), values.to(d), None, None)
           for d in ("cpu", dev.type)]
    segs = list(torch.split(values, lengths.sum(1).tolist()))
    want_l, want_v = lengths[perm.long()], torch.cat([segs[i] for i in perm.tolist()])
    ok = all(torch.equal(r[0].cpu(), want_l) and torch.equal(r[1].cpu(), want_v) for r in res)
    check("permute_2D_sparse_data", ok)
    pl, pv, _ = fb.permute_1D_sparse_data(perm.to(dev), lengths[:, 0].contiguous().to(dev),
                                          values[:int(lengths[:, 0].sum())].to(dev), None, None)
    check("permute_1D_sparse_data (ran)", pl.numel() == perm.numel())
except Exception as e:  # noqa: BLE001
    check("permute_2D_sparse_data", False, f"{type(e).__name__}: {str(e)[:300]}")

try:
    T, Bs, W = 2, 8, 4
    lengths = torch.randint(0, 5, (T * Bs,), generator=g).long()
    rows = 1000
    indices = torch.randint(0, rows, (int(lengths.sum()),), generator=g).long()
    block_sizes = torch.tensor([(rows + W - 1) // W] * T).long()
    res = [fb.block_bucketize_sparse_features(lengths.to(d), indices.to(d), False, False,
                                              block_sizes.to(d), W, None) for d in ("cpu", dev.type)]
    ok = torch.equal(res[0][0].cpu(), res[1][0].cpu()) and torch.equal(res[0][1].cpu(), res[1][1].cpu())
    # reference: bucket = idx // block, new idx = idx % block; order: bucket-major, then feature, then bag
    bl = torch.zeros(W, T * Bs, dtype=torch.long)
    bv = [[[] for _ in range(T * Bs)] for _ in range(W)]
    pos = 0
    for fbag in range(T * Bs):
        f = fbag // Bs
        for _ in range(int(lengths[fbag])):
            i = int(indices[pos])
            pos += 1
            w, r = i // int(block_sizes[f]), i % int(block_sizes[f])
            bl[w, fbag] += 1
            bv[w][fbag].append(r)
    want_v = torch.tensor([r for w in range(W) for fbag in range(T * Bs) for r in bv[w][fbag]]).long()
    ok = ok and torch.equal(res[1][0].cpu().long(), bl.reshape(-1)) and torch.equal(res[1][1].cpu().long(), want_v)
    check("block_bucketize_sparse_features", ok)
except Exception as e:  # noqa: BLE001
    check("block_bucketize_sparse_features", False, f"{type(e).__name__}: {str(e)[:300]}")

print(f"total_s {time.time() - t0:.1f}")
if failures:
    print("FAILED:", failures)
    sys.exit(1)
print("ALL OK")
