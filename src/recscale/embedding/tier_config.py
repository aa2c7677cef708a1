"""``TierConfig``: the ``train.tiers`` parameters of the tiered embedding store (slow tier, cache
fraction, eviction policy, scratch directory, prefetch, fsync, RAM budget)."""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from typing import ClassVar, Literal

from recscale.config import Validated, check, check_choice
from recscale.sharding import Topology

TIER_KINDS = ("ddr", "ssd")
POLICIES = ("lru", "lfu")


@dataclass(frozen=True)
class TierConfig(Validated):
    """Settings of the tiered embedding store (the ``train.tiers`` parameters).

    - ``tier``: slow tier of a module built directly (from a plan: each shard's tier).
    - ``cache_fraction``: cached rows / table rows; null = the plan's cache fraction per shard
      (0.2 for a module built directly).
    - ``policy``: eviction, ``lru`` or ``lfu``.
    - ``scratch_dir``: where SSD-tier table files go ("" = the system temp directory).
    - ``min_cache_rows``: the cache holds at least this many rows per table (a plan may give a
      cache fraction of 0); capped at the table's rows.
    - ``prefetch``: load the next batch's rows on a background thread while a batch computes.
    - ``fsync``: fsync every SSD write-back (survives power loss, not only a killed process);
      ``flush()`` always syncs.
    - ``ram_budget_bytes``: host memory per rank for embeddings; the planner puts what does not
      fit on the SSD tier (``Topology.with_ram_budget``). null = the topology's memory.
    """

    RENAMED: ClassVar[dict[str, str]] = {"cache_load_factor": "cache_fraction"}

    tier: Literal["ddr", "ssd"] = "ssd"
    cache_fraction: float | None = None
    policy: Literal["lru", "lfu"] = "lru"
    scratch_dir: str = ""
    min_cache_rows: int = 4096
    prefetch: bool = True
    fsync: bool = False
    ram_budget_bytes: int | None = None

    def budgeted(self, topology: Topology) -> Topology:
        """The topology to plan on: with ``ram_budget_bytes`` each rank gets that much RAM for
        embeddings and an SSD tier of the free space of ``scratch_dir`` (shared by the host's
        ranks), so the planner puts what does not fit on SSD; unchanged when it is null."""
        if self.ram_budget_bytes is None:
            return topology
        scratch = self.scratch_dir or tempfile.gettempdir()
        os.makedirs(scratch, exist_ok=True)
        free = shutil.disk_usage(scratch).free / topology.local_world_size
        return topology.with_ram_budget(self.ram_budget_bytes, free)

    def validate(self, prefix: str = "train.tiers") -> None:
        check_choice(f"{prefix}.tier", self.tier, TIER_KINDS)
        check_choice(f"{prefix}.policy", self.policy, POLICIES)
        c = self.cache_fraction
        check(c is None or (isinstance(c, (int, float)) and 0 < c <= 1),
              f"{prefix}.cache_fraction", c, "null or a number in (0, 1]")
        check(isinstance(self.min_cache_rows, int) and self.min_cache_rows >= 1,
              f"{prefix}.min_cache_rows", self.min_cache_rows, "an integer >= 1")
        check(isinstance(self.scratch_dir, str), f"{prefix}.scratch_dir", self.scratch_dir,
              "a directory path ('' = the system temp directory)")
        b = self.ram_budget_bytes
        check(b is None or (isinstance(b, int) and b > 0), f"{prefix}.ram_budget_bytes", b,
              "null or a positive integer (bytes)")
