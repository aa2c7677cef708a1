"""``LaunchConfig``: how many workers, on how many hosts, and how long every wait may last.

The ``train.launch`` block of both parameter files (DLRM and Hessian-free training).
"""

from __future__ import annotations

from dataclasses import dataclass

from recscale.config import Validated, check, check_choice

START_METHODS = ("forkserver", "spawn")


@dataclass(frozen=True)
class LaunchConfig(Validated):
    """Settings of :func:`recscale.distributed.launch` and :func:`init_worker`."""

    world_size: int = 1  # ranks in all
    nnodes: int = 1  # hosts; each starts world_size / nnodes workers
    rdzv_endpoint: str = "127.0.0.1:0"  # host:port of the rendezvous (port 0: pick one, 1 host)
    max_restarts: int = 0  # elastic restarts of the worker group after a failure
    collective_timeout_s: float = 300.0  # a collective (or the final barrier) stuck this long fails
    exit_timeout_s: float = 60.0  # a rank still running this long after the last rank finished
    # is ended, and the launch fails naming it
    start_method: str = "forkserver"  # forkserver: workers forked from one process with torch
    # imported (fast starts and restarts); spawn: a fresh interpreter per worker

    def validate(self, prefix: str = "train.launch") -> None:
        check(self.world_size >= 1, f"{prefix}.world_size", self.world_size, ">= 1")
        check(self.nnodes >= 1 and self.world_size % self.nnodes == 0, f"{prefix}.nnodes",
              self.nnodes, f"a divisor of {prefix}.world_size={self.world_size}")
        check(isinstance(self.rdzv_endpoint, str) and ":" in self.rdzv_endpoint,
              f"{prefix}.rdzv_endpoint", self.rdzv_endpoint, "host:port")
        check(self.max_restarts >= 0, f"{prefix}.max_restarts", self.max_restarts, ">= 0")
        check(self.collective_timeout_s > 0, f"{prefix}.collective_timeout_s",
              self.collective_timeout_s, "> 0")
        check(self.exit_timeout_s > 0, f"{prefix}.exit_timeout_s", self.exit_timeout_s, "> 0")
        check_choice(f"{prefix}.start_method", self.start_method, START_METHODS)

    @property
    def nproc_per_node(self) -> int:
        return self.world_size // self.nnodes
