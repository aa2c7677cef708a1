"""PLACEHOLDER (the planner branch brings the real one): the typed ``sharding`` block."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from recscale.config import Validated, check

from .topology import PRESETS
from .types import PlannerOptions


@dataclass(frozen=True)
class ShardingConfig(Validated):
    topology: str = "cpu-local"
    world_size: int | None = None
    local_world_size: int | None = None
    options: Any = field(default_factory=dict)

    def validate(self, prefix: str = "sharding") -> None:
        check(self.topology in PRESETS, f"{prefix}.topology", self.topology,
              "one of " + ", ".join(PRESETS))
        object.__setattr__(self, "options", PlannerOptions.coerce(self.options))
