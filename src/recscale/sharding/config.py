"""``ShardingConfig``: the typed ``sharding`` block of the DLRM parameters.

```yaml
sharding:
  topology: cpu-local      # a preset of recscale.sharding.Topology (PRESETS), or a topology
                           # file (.yml/.yaml/.json) that `recscale calibrate` wrote
  calibrate: false         # measure this machine first (the sharding pipeline's calibrate node)
  calibration_seconds: 20  # ... for at least this long (sweeps spread over the cores' spells)
  calibration_history: null  # a points file: every run's calibration kept there, the plan made
                           # on the median of the last 10 (`recscale calibrate --merge`'s file)
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

from recscale.config import Validated, check

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
    calibrate: bool = False
    calibration_seconds: float = 20.0
    calibration_history: str | None = None
    world_size: int | None = None
    local_world_size: int | None = None
    # a PlannerOptions after construction; typed Any so that parse hands a mapping over as is
    options: Any = field(default_factory=PlannerOptions)

    def validate(self, prefix: str = "sharding") -> None:
        check(isinstance(self.topology, str) and (self.topology in PRESETS or is_topology_file(
            self.topology)), f"{prefix}.topology", self.topology,
            f"one of {', '.join(map(repr, PRESETS))} or a topology file (.yml, .yaml, .json) "
            "written by "
            "`recscale calibrate`")
        check(isinstance(self.calibrate, bool), f"{prefix}.calibrate", self.calibrate,
              "true or false")
        check(not isinstance(self.calibration_seconds, bool)
              and isinstance(self.calibration_seconds, (int, float))
              and 0 <= self.calibration_seconds <= 600, f"{prefix}.calibration_seconds",
              self.calibration_seconds, "seconds in [0, 600]")
        check(self.calibration_history is None or (isinstance(self.calibration_history, str)
                                                   and self.calibration_history.endswith(".json")),
              f"{prefix}.calibration_history", self.calibration_history,
              "null or a .json file (e.g. data/06_models/topology.points.json)")
        _none_or_positive_int(f"{prefix}.world_size", self.world_size)
        _none_or_positive_int(f"{prefix}.local_world_size", self.local_world_size)
        if isinstance(self.options, Mapping):  # parameters: the run sets these two, once
            for key, where in (("optimizer", "train.embedding_optimizer.name"),
                               ("comms", "the top-level comms block")):
                check(key not in self.options, f"{prefix}.options.{key}", self.options.get(key),
                      f"not set here: the planner plans with the run's own ({where})")
        object.__setattr__(self, "options",
                           PlannerOptions.coerce(self.options, key=f"{prefix}.options"))

    def topology_for(self, run_world_size: int, measured: Topology | None = None) -> Topology:
        """The topology (``measured``, else the preset or the file ``topology`` names) for
        ``world_size`` ranks, or ``run_world_size`` when that is null."""
        ws = self.world_size or run_world_size
        if measured is None and self.topology in PRESETS:
            return Topology.preset(self.topology, world_size=ws,
                                   local_world_size=self.local_world_size)
        base = measured if measured is not None else Topology.load(self.topology)
        return base.for_world(ws, self.local_world_size)


def is_topology_file(name: str) -> bool:
    """Whether ``sharding.topology`` names a file rather than a preset."""
    return isinstance(name, str) and name.lower().endswith((".yml", ".yaml", ".json"))
