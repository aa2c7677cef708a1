"""``ShardingConfig``: the typed ``sharding`` block of the DLRM parameters.

```yaml
sharding:
  topology: cpu-local      # a preset of recscale.sharding.Topology (PRESETS)
  world_size: null         # null = the training run's world size
  local_world_size: null   # null = the preset's ranks per host (capped at world_size)
  options:                 # fields of PlannerOptions
    weight_precision: fp32
```

``recscale.config.parse(ShardingConfig, params, "sharding")`` builds it; unknown keys and bad values
name the full key (``sharding.topolgy``, ``sharding.options.memory_fraction``). The training run
decides the embedding optimizer and the wire precisions, so a node fills ``options.optimizer`` and
``options.comms`` from the train and comms blocks (``dataclasses.replace(cfg.options, ...)`` or
``PlannerOptions.coerce(cfg.options, optimizer=..., comms=...)``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from numbers import Integral
from typing import Any

from recscale.config import Validated, check, check_choice

from .topology import PRESETS, Topology
from .types import PlannerOptions


def _none_or_positive_int(key: str, value: Any) -> None:
    check(value is None or (not isinstance(value, bool) and isinstance(value, Integral)
                            and value > 0), key, value, "null or a positive integer")


@dataclass(frozen=True)
class ShardingConfig(Validated):
    """Where the planner plans for: a topology preset, the ranks, and the planner's options.

    ``options`` may be given as a ``PlannerOptions``, a mapping of its fields, or None (the
    defaults); after construction it is always a ``PlannerOptions``. It is built by
    ``PlannerOptions.coerce`` in ``validate``, where the key prefix is known, because ``parse``'s
    generic coercion does not fit ``PlannerOptions`` (``comms`` may be one precision name,
    ``split_fractions`` one number, and its errors would not name ``sharding.options``).
    """

    topology: str = "cpu-local"
    world_size: int | None = None
    local_world_size: int | None = None
    # a PlannerOptions after construction; typed Any so that parse hands a mapping over as is
    options: Any = field(default_factory=PlannerOptions)

    def validate(self, prefix: str = "sharding") -> None:
        check_choice(f"{prefix}.topology", self.topology, tuple(PRESETS))
        _none_or_positive_int(f"{prefix}.world_size", self.world_size)
        _none_or_positive_int(f"{prefix}.local_world_size", self.local_world_size)
        if isinstance(self.options, Mapping):  # parameters: the run sets these two, once
            for key, where in (("optimizer", "train.embedding_optimizer.name"),
                               ("comms", "the top-level comms block")):
                check(key not in self.options, f"{prefix}.options.{key}", self.options.get(key),
                      f"not set here: the planner plans with the run's own ({where})")
        object.__setattr__(self, "options",
                           PlannerOptions.coerce(self.options, key=f"{prefix}.options"))

    def topology_for(self, run_world_size: int) -> Topology:
        """The topology preset for ``world_size`` ranks, or ``run_world_size`` when that is null."""
        return Topology.preset(self.topology, world_size=self.world_size or run_world_size,
                               local_world_size=self.local_world_size)
