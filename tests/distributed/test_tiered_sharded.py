"""2 gloo ranks: a plan with an SSD shard and DDR row shards trains bitwise like the same plan
with every shard in the compute tier (pipelined, with the next batch prefetched)."""

import numpy as np
import pytest

from recscale.distributed import LaunchConfig, launch
from tests.distributed import tier_workers as TW

pytestmark = pytest.mark.dist

OPTS = ["exact_sgd", "exact_rowwise_adagrad"]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    cfg = LaunchConfig(world_size=2, collective_timeout_s=60)
    scratch = str(tmp_path_factory.mktemp("tiers"))
    return launch(TW.tiered_parity_worker, (OPTS, TW.make_batches(6), scratch), cfg)[0]


@pytest.mark.parametrize("opt", OPTS)
def test_ssd_and_ddr_shards_train_bitwise_like_the_all_hbm_plan(results, opt):
    hbm, tiered = results[(opt, False)], results[(opt, True)]
    assert hbm["local_kinds"] == "FusedEmbeddingBags"
    assert tiered["local_kinds"] == "MultiTierEmbeddingBags"  # memory + ssd + ddr groups
    # each batch's received ids are split by tier group once: the prefetch's parts are reused
    assert tiered["splits"] == [6, 6]
    for t, (a, b) in enumerate(zip(hbm["tables"], tiered["tables"])):
        assert np.array_equal(a, b), f"table {t}"
    for t, (a, b) in enumerate(zip(hbm["states"], tiered["states"])):
        assert all(np.array_equal(x, y) for x, y in zip(a, b)), f"table {t} state"
    for k, v in hbm["dense"].items():
        assert np.array_equal(v, tiered["dense"][k]), k
    # both ranks hold a slow-tier shard (t0 on SSD on rank 0, t2's row blocks on DDR on both);
    # the caches were 5x smaller than the shards, so rows were evicted, and prefetch loaded some
    for rank, s in enumerate(tiered["stats"]):
        assert s["lookups"] > 0 and 0 < s["hit_rate"] < 1 and s["evictions"] > 0, (rank, s)
        assert s["prefetch_rows"] > 0 and s["bytes_read.ddr"] > 0, (rank, s)
    assert tiered["stats"][0]["bytes_read.ssd"] > 0 and tiered["stats"][0]["bytes_written.ssd"] > 0
    assert hbm["stats"] == [{}, {}]
    # the fast tier holds less than the all-in-memory shards (caches are 1/5 of the rows)
    assert tiered["embedding_bytes"][0] < hbm["embedding_bytes"][0]
