"""The files through which workers tell their launcher how far they got.

``launch`` makes a directory per launch and names it in ``RECSCALE_LAUNCH_DIR``; the workers it
starts inherit it. ``worker_entry`` writes, per rank and elastic attempt: ``start`` (pid, worker
function) when the worker function is entered, ``done`` (returned or raised, and when) when it
left it, ``error`` (message, traceback) when it raised, and registers ``stack``, the file a
SIGUSR1 makes the process dump its Python stacks into. The launcher's exit watch reads them, and
writes ``verdict.json`` when it ended a rank that did not exit: a restarted worker that finds it
fails at once, so the elastic agent's restarts do not run the job again.

Every file is written to a temporary name and renamed, so a reader never sees half of one.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

ENV = "RECSCALE_LAUNCH_DIR"
VERDICT = "verdict.json"


def launch_dir() -> str | None:
    return os.environ.get(ENV) or None


def attempt() -> int:
    """The elastic agent's restart count of this worker group (0: the first start)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def path(where: str, kind: str, rank_: int, attempt_: int, ext: str = "json") -> str:
    return os.path.join(where, f"{kind}.rank{rank_}.a{attempt_}.{ext}")


def write(file: str, record: dict[str, Any]) -> None:
    tmp = f"{file}.{os.getpid()}.tmp"
    with open(tmp, "w") as fh:
        json.dump(record, fh)
    os.replace(tmp, file)


def read(file: str) -> dict[str, Any] | None:
    try:
        with open(file) as fh:
            return json.load(fh)
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def read_all(where: str, kind: str) -> list[dict[str, Any]]:
    """Every ``kind`` record in ``where`` (all ranks, all attempts)."""
    out = []
    for name in sorted(os.listdir(where)):
        if name.startswith(kind + ".rank") and name.endswith(".json"):
            rec = read(os.path.join(where, name))
            if rec is not None:
                out.append(rec)
    return out


def now() -> float:
    return time.time()
