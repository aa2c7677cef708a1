#!/usr/bin/env bash
# CUDA checks and timings in one go, for a machine with NVIDIA GPUs. Each step reports on its own
# and the script goes on after a failure; the exit status is 1 if any step failed.
#   1. fbgemm itself: TBE forward/backward with the fused optimizers (EXACT_SGD, EXACT_ROWWISE_ADAGRAD,
#      EXACT_ADAGRAD), locations DEVICE and MANAGED_CACHING (LRU, LFU), vs a float64 reference;
#      the sparse ops the sharded runtime uses (benchmarks/gpu_fbgemm_smoke.py)
#   2. recscale's FusedEmbeddingBags: CUDA vs CPU after a fused update, and its step time
#   3. recscale's tiered embeddings on CUDA (MANAGED_CACHING), when the module is present
#   4. the training stack on the GPU vs the CPU: single process, the sharded runtime as a 1-rank
#      NCCL group with a mixed plan, a GPU checkpoint resumed on the CPU (gpu_sharded_check.py)
#   5. NCCL parity tests with 2 ranks, when 2 GPUs are present
#   6. training-step throughput on the GPU vs plain PyTorch (benchmarks/bench_train.py)
# On a machine without CUDA it says so and exits 0. Output also goes to benchmarks/out/gpu_check.log.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
export PYTHONUNBUFFERED=1
mkdir -p benchmarks/out
exec > >(tee benchmarks/out/gpu_check.log) 2>&1
if ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  echo "gpu_check: no CUDA device visible to torch ($("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo 'torch missing')); nothing to check."
  exit 0
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
"$PY" -c 'import torch, fbgemm_gpu; print("torch", torch.__version__, "cuda", torch.version.cuda, "fbgemm_gpu", fbgemm_gpu.__version__)'
failed=()
step() {  # step NAME TIMEOUT_S COMMAND...
  local name=$1 limit=$2; shift 2
  echo; echo "== $name"
  local t0=$SECONDS
  timeout "$limit" "$@"; local rc=$?
  echo "-- $name: rc=$rc, $((SECONDS - t0)) s"
  [ $rc -eq 0 ] || failed+=("$name")
}

step "1. fbgemm CUDA TBE + MANAGED_CACHING + sparse ops" 240 "$PY" benchmarks/gpu_fbgemm_smoke.py

step "2. FusedEmbeddingBags CUDA vs CPU" 180 "$PY" - <<'PY'
import time, torch
from recscale.embedding import EmbeddingOptimizerConfig, FusedEmbeddingBags
from recscale.data.batch import SparseFeatures
rows, dims = [100_000] * 8, [128] * 8
for name in ("exact_rowwise_adagrad", "exact_sgd"):
    opt = EmbeddingOptimizerConfig(name, 0.1)
    cpu = FusedEmbeddingBags(rows, dims, opt, device="cpu", seed=1)
    gpu = FusedEmbeddingBags(rows, dims, opt, device="cuda", seed=1)
    g = torch.Generator().manual_seed(0)
    B = 4096
    lengths = torch.randint(0, 4, (8, B), generator=g)
    values = torch.randint(0, 100_000, (int(lengths.sum()),), generator=g)
    sp = SparseFeatures(tuple("abcdefgh"), values, lengths)
    up = torch.randn(B, 1024, generator=g)
    (cpu(sp) * up).sum().backward()
    (gpu(sp.to("cuda")) * up.cuda()).sum().backward()
    err = max((a.cpu() - b).abs().max().item() for a, b in zip(gpu.split_weights(), cpu.split_weights()))
    print(f"{name}: max |cuda - cpu| after one fused step: {err:.2e}")
    assert err < 1e-4, err
    spc, upc = sp.to("cuda"), up.cuda()
    for _ in range(5):
        (gpu(spc) * upc).sum().backward()
    torch.cuda.synchronize(); t0 = time.perf_counter()
    for _ in range(50):
        (gpu(spc) * upc).sum().backward()
    torch.cuda.synchronize()
    print(f"{name}: fused lookup+update, 8 tables x 100k x 128, batch {B}: "
          f"{(time.perf_counter()-t0)/50*1e3:.3f} ms/step")
PY

if "$PY" -c 'import recscale.embedding.cache' 2>/dev/null && [ -f benchmarks/gpu_tiered_check.py ]; then
  step "3. tiered embeddings on CUDA (MANAGED_CACHING)" 180 "$PY" benchmarks/gpu_tiered_check.py
else
  echo; echo "== 3. tiered embeddings: not in this checkout, skipped"
fi

step "4. training stack on the GPU vs the CPU (single process, 1-rank NCCL sharded, checkpoint)" 360 \
  "$PY" benchmarks/gpu_sharded_check.py

NGPU=$("$PY" -c 'import torch; print(torch.cuda.device_count())')
if [ "$NGPU" -ge 2 ]; then
  step "5. NCCL sharded parity, 2 ranks" 600 "$PY" -m pytest -q tests/distributed/test_sharded_parity.py
else
  echo; echo "== 5. only $NGPU GPU: the 2-rank NCCL parity run needs 2, skipped"
fi

step "6. training-step throughput on the GPU" 300 \
  "$PY" benchmarks/bench_train.py --device cuda --quality-rows 0 --reps 3 --steps 30

echo
if [ ${#failed[@]} -eq 0 ]; then echo "gpu_check: ALL OK"; exit 0; fi
printf 'gpu_check: FAILED: %s\n' "${failed[@]}"
exit 1
