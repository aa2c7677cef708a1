"""Memory tiers on CUDA: fbgemm's MANAGED_CACHING (the DDR tier on a GPU, managed_caching_bags) and
the SSD-tier software cache in front of a CUDA fbgemm module, each against the CPU module after 5
fused row-wise Adagrad steps; plus the SSD cache's hit rate. Run by benchmarks/gpu_check.sh."""
import tempfile

import torch

from recscale.data.batch import SparseFeatures
from recscale.embedding import (
    EmbeddingOptimizerConfig,
    FusedEmbeddingBags,
    TierConfig,
    TieredEmbeddingBags,
    managed_caching_bags,
)

rows, dims = [200_000] * 4, [64] * 4
opt = EmbeddingOptimizerConfig("exact_rowwise_adagrad", 0.1)
cpu = FusedEmbeddingBags(rows, dims, opt, device="cpu", seed=1)
managed = managed_caching_bags(rows, dims, opt, cache_fraction=0.1, device="cuda",
                               initial_weights=[w.detach().clone() for w in cpu.split_weights()])
ssd = TieredEmbeddingBags(rows, dims, opt, device="cuda", seed=1, config=TierConfig(
    tier="ssd", cache_fraction=0.1, scratch_dir=tempfile.mkdtemp()))
g = torch.Generator().manual_seed(0)
B = 4096
for _step in range(5):
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
