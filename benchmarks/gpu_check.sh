#!/usr/bin/env bash
# CUDA checks and timings in one go, for a machine with NVIDIA GPUs:
#   1. fbgemm's CUDA table-batched embedding: fused update parity with the CPU kernel
#   2. NCCL: the sharded runtime's parity tests on 2 GPUs (when 2 are present)
#   3. training-step throughput on the GPU (benchmarks/bench_train.py)
#   4. memory tiers: fbgemm MANAGED_CACHING (managed_caching_bags) and the SSD-tier cache on CUDA
# On a machine without CUDA it says so and exits 0. Output also goes to benchmarks/out/gpu_check.log.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
mkdir -p benchmarks/out
exec > >(tee benchmarks/out/gpu_check.log) 2>&1
if ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  echo "gpu_check: no CUDA device visible to torch ($("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo 'torch missing')); nothing to check."
  exit 0
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
status=0
echo "== 1. fbgemm CUDA embeddings vs CPU"
"$PY" - <<'PY' || status=1
import time, torch
from recscale.embedding import EmbeddingOptimizerConfig, FusedEmbeddingBags
from recscale.data.batch import SparseFeatures
rows, dims = [100_000] * 8, [128] * 8
opt = EmbeddingOptimizerConfig("exact_rowwise_adagrad", 0.1)
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
print(f"max |cuda - cpu| after one fused rowwise-adagrad step: {err:.2e}")
assert err < 1e-4, err
torch.cuda.synchronize(); t0 = time.perf_counter()
for _ in range(50):
    (gpu(sp.to("cuda")) * up.cuda()).sum().backward()
torch.cuda.synchronize()
print(f"fused lookup+update, 8 tables x 100k x 128, batch {B}: {(time.perf_counter()-t0)/50*1e3:.2f} ms/step")
PY
NGPU=$("$PY" -c 'import torch; print(torch.cuda.device_count())')
echo "== 2. NCCL sharded runtime parity (GPUs: $NGPU)"
if [ "$NGPU" -ge 2 ]; then
  "$PY" -m pytest -q tests/distributed || status=1  # device auto: the workers pick CUDA + NCCL
else
  echo "only $NGPU GPU: skipping the 2-rank NCCL run"
fi
echo "== 3. training-step throughput on the GPU"
"$PY" benchmarks/bench_train.py --device cuda --quality-rows 0 --reps 3 --steps 20 || status=1
echo "== 4. tiers: fbgemm MANAGED_CACHING (DDR tier on CUDA) and the SSD-tier cache on CUDA vs CPU"
"$PY" - <<'PY' || status=1
import tempfile, torch
from recscale.data.batch import SparseFeatures
from recscale.embedding import EmbeddingOptimizerConfig, FusedEmbeddingBags
from recscale.embedding.tiered import TierConfig, TieredEmbeddingBags, managed_caching_bags
rows, dims = [200_000] * 4, [64] * 4
opt = EmbeddingOptimizerConfig("exact_rowwise_adagrad", 0.1)
cpu = FusedEmbeddingBags(rows, dims, opt, device="cpu", seed=1)
managed = managed_caching_bags(rows, dims, opt, cache_load_factor=0.1, device="cuda",
                               initial_weights=[w.detach().clone() for w in cpu.split_weights()])
ssd = TieredEmbeddingBags(rows, dims, opt, device="cuda", seed=1, config=TierConfig(
    tier="ssd", cache_load_factor=0.1, scratch_dir=tempfile.mkdtemp()))
g = torch.Generator().manual_seed(0)
B = 4096
for step in range(5):
    lengths = torch.randint(0, 3, (4, B), generator=g)
    values = (torch.randint(0, 2**20, (int(lengths.sum()),), generator=g) ** 2) % 200_000
    sp = SparseFeatures(tuple("abcd"), values, lengths)
    up = torch.randn(B, 256, generator=g)
    (cpu(sp) * up).sum().backward()
    (managed(sp.to("cuda")) * up.cuda()).sum().backward()
    (ssd(sp.to("cuda")) * up.cuda()).sum().backward()
for name, mod in (("managed caching", managed), ("ssd tier on cuda", ssd)):
    err = max((a.cpu() - b).abs().max().item() for a, b in zip(mod.split_weights(), cpu.split_weights()))
    print(f"{name}: max |cuda - cpu| after 5 fused rowwise-adagrad steps: {err:.2e}")
    assert err < 1e-4, err
print("ssd tier on cuda:", {k: round(v, 3) for k, v in ssd.tier_stats().items() if k in ("hit_rate", "rows_read", "rows_written")})
PY
exit $status
