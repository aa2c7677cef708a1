"""The wire precisions of the sharded runtime's collectives: one typed config (``comms``) read by
the runtime (which codec encodes each exchange) and by the sharding planner (what each exchange
costs). Torch-free, so the planner can import it without torch."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from recscale.config import ConfigError, Validated, check, check_choice, parse

WIRE_PRECISIONS = ("fp32", "fp16", "bf16", "fp8", "int8")
ALLREDUCE_PRECISIONS = ("fp32", "fp16", "bf16")  # a sum of 8-bit row codes is not a code


@dataclass(frozen=True)
class CommsConfig(Validated):
    """Wire precision per direction: pooled embeddings forward, their gradients backward, and the
    dense gradients' all-reduce (DDP communication hook). ``loss_scale`` multiplies fp16 backward
    gradients before encoding (and divides after) so small gradients do not flush to zero."""

    forward: str = "fp32"
    backward: str = "fp32"
    dense_allreduce: str = "fp32"
    loss_scale: float = 1024.0

    def validate(self, prefix: str = "comms") -> None:
        check_choice(f"{prefix}.forward", self.forward, WIRE_PRECISIONS)
        check_choice(f"{prefix}.backward", self.backward, WIRE_PRECISIONS)
        check(self.dense_allreduce in ALLREDUCE_PRECISIONS, f"{prefix}.dense_allreduce",
              self.dense_allreduce,
              "one of 'fp32', 'fp16', 'bf16' (an all-reduce sums its inputs; 8-bit row codes "
              "with per-row scales cannot be summed)")
        check(self.loss_scale > 0, f"{prefix}.loss_scale", self.loss_scale, "> 0")

    @classmethod
    def coerce(cls, value: Any, key: str = "comms") -> CommsConfig:
        """A CommsConfig from itself, None (fp32 everywhere), a mapping of its fields, or one
        precision name for both embedding exchanges (the dense all-reduce takes it too when an
        all-reduce can sum it, else stays fp32)."""
        if value is None:
            return cls()
        if isinstance(value, CommsConfig):
            return value
        if isinstance(value, str):
            check_choice(key, value, WIRE_PRECISIONS)
            dense = value if value in ALLREDUCE_PRECISIONS else "fp32"
            return cls(value, value, dense)
        if isinstance(value, Mapping):
            return parse(cls, value, key)
        raise ConfigError(f"{key}={value!r} is not allowed: expected a precision name or a "
                          "mapping with forward/backward/dense_allreduce")

    def to_dict(self) -> dict[str, Any]:
        return {"forward": self.forward, "backward": self.backward,
                "dense_allreduce": self.dense_allreduce, "loss_scale": self.loss_scale}
