"""``LaunchConfig``: how many workers, on how many hosts, and how long every wait may last.

The ``train.launch`` block of both parameter files (DLRM and Hessian-free training).

``nnodes`` is a number of hosts, or a range ``"min:max"``: the job starts once ``min`` hosts
have joined (waiting ``last_call_s`` more for the rest), goes on when a host is lost as long as
``min`` remain, and takes a returning host back at the next restart. Each host runs
``world_size / max`` workers, so ``world_size`` is the ranks of the job at full size.
"""

from __future__ import annotations

from dataclasses import dataclass

from recscale.config import Validated, check, check_choice

START_METHODS = ("forkserver", "spawn")


def parse_nnodes(value: int | str) -> tuple[int, int] | None:
    """``2`` -> (2, 2); ``"2:3"`` -> (2, 3); anything else (``"3:2"``, ``0``, ``"a:b"``) -> None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return (value, value) if value >= 1 else None
    if isinstance(value, str):
        parts = value.split(":")
        if len(parts) == 1:
            parts = parts * 2
        if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
            return None
        lo, hi = (int(p) for p in parts)
        return (lo, hi) if 1 <= lo <= hi else None
    return None


def base60_hint(value) -> str:
    """What to add to an error about ``nnodes=value`` when the integer is what YAML 1.1 makes of
    an unquoted ``min:max`` (``2:3`` is 2 x 60 + 3 = 123), else nothing."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 60:
        lo, hi = divmod(value, 60)
        if 1 <= lo <= hi:
            return (f" (YAML 1.1 reads an unquoted {lo}:{hi} as the base-60 integer {value}: "
                    f"write \"{lo}:{hi}\" in a parameters or run file; kedro run --params keeps "
                    f"{lo}:{hi} as typed)")
    return ""


@dataclass(frozen=True)
class LaunchConfig(Validated):
    """Settings of :func:`recscale.distributed.launch` and :func:`init_worker`."""

    world_size: int = 1  # ranks in all (at full size, with the most hosts)
    nnodes: int | str = 1  # hosts: a number, or "min:max" (elastic: lose and regain hosts)
    rdzv_endpoint: str = "127.0.0.1:0"  # host:port of the rendezvous (port 0: pick one, 1 host)
    max_restarts: int = 0  # elastic restarts of the worker group after a failure
    collective_timeout_s: float = 300.0  # a collective (or the final barrier) stuck this long fails
    exit_timeout_s: float = 60.0  # a rank still running this long after the last rank finished
    # is ended, and the launch fails naming it
    start_method: str = "forkserver"  # forkserver: workers forked from one process with torch
    # imported (fast starts and restarts); spawn: a fresh interpreter per worker
    # several hosts: how long hosts may take to join (and a joining host waits for the driver)
    rdzv_timeout_s: float = 600.0
    last_call_s: float = 5.0  # nnodes min:max: once min hosts joined, wait this long for more
    heartbeat_s: float = 5.0  # a host silent for 3 heartbeats is taken as lost
    local_addr: str | None = None  # this host's address for the others; null: the address of
    # the interface that routes to rdzv_endpoint
    # several hosts: the file holding the job's secret, which signs the job every host verifies
    # (RECSCALE_JOB_SECRET in the environment takes precedence; neither: a new one is written
    # 0600 beside the job's output and its path logged)
    secret_file: str | None = None

    def validate(self, prefix: str = "train.launch") -> None:
        check(self.world_size >= 1, f"{prefix}.world_size", self.world_size, ">= 1")
        nodes = parse_nnodes(self.nnodes)
        check(nodes is not None, f"{prefix}.nnodes", self.nnodes,
              "a number of hosts >= 1, or 'min:max' with 1 <= min <= max")
        check(self.world_size % nodes[1] == 0, f"{prefix}.nnodes", self.nnodes,
              f"a divisor of {prefix}.world_size={self.world_size} (for 'min:max': max)"
              + base60_hint(self.nnodes))
        check(isinstance(self.rdzv_endpoint, str) and ":" in self.rdzv_endpoint
              and self.rdzv_endpoint.rsplit(":", 1)[1].isdigit(),
              f"{prefix}.rdzv_endpoint", self.rdzv_endpoint, "host:port")
        check(self.max_restarts >= 0, f"{prefix}.max_restarts", self.max_restarts, ">= 0")
        check(nodes[0] == nodes[1] or self.max_restarts >= 1, f"{prefix}.max_restarts",
              self.max_restarts, f">= 1 with {prefix}.nnodes={self.nnodes!r} (a lost host "
              "restarts the workers that are left)")
        for key in ("collective_timeout_s", "exit_timeout_s", "rdzv_timeout_s", "last_call_s",
                    "heartbeat_s"):
            check(getattr(self, key) > 0, f"{prefix}.{key}", getattr(self, key), "> 0")
        check_choice(f"{prefix}.start_method", self.start_method, START_METHODS)
        check(self.secret_file is None or (isinstance(self.secret_file, str) and self.secret_file),
              f"{prefix}.secret_file", self.secret_file, "null or the path of a file")

    @property
    def min_nodes(self) -> int:
        return parse_nnodes(self.nnodes)[0]

    @property
    def max_nodes(self) -> int:
        return parse_nnodes(self.nnodes)[1]

    @property
    def multi_host(self) -> bool:
        return self.max_nodes > 1

    @property
    def nproc_per_node(self) -> int:
        return self.world_size // self.max_nodes
