"""Raw partitions (one file per day) and the durable ledger of the ones already trained on.

A partition is identified by its name relative to the landing directory. Once recorded in the
ledger it is never consumed again, even if the file is rewritten (that is reported, not retrained:
rename the file to train on it). The ledger is JSON, replaced atomically (write a temporary file
in the same directory, fsync, rename), so a crash leaves the old or the new ledger, never half.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import logging
import os
import re
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

log = logging.getLogger(__name__)

LEDGER_FORMAT = "recscale-retrain-ledger/1"


def natural_key(name: str) -> tuple:
    """Sort key that puts day_2 before day_10 (Criteo names its days day_0 .. day_23)."""
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name))


@dataclass(frozen=True)
class Partition:
    name: str  # relative to the landing directory: the identity recorded in the ledger
    path: str
    bytes: int
    mtime_ns: int


def find_partitions(landing_dir: str | os.PathLike, pattern: str) -> list[Partition]:
    """Files (or directories of files: a day's parquet parts, ``day=2026-12-01/``) under
    ``landing_dir`` matching ``pattern``, in natural name order (= time order). What is still
    being written (``*.tmp``, ``*.partial``, hidden names) is not a partition; a directory's size
    is its files' total, its time the newest file's."""
    root = Path(landing_dir)
    if not root.is_dir():
        return []
    out = []
    for p in root.glob(pattern):
        if p.name.startswith(".") or p.name.endswith((".tmp", ".partial")):
            continue
        if p.is_file():
            st = p.stat()
            size, mtime = st.st_size, st.st_mtime_ns
        elif p.is_dir():
            files = [f for f in p.rglob("*") if f.is_file() and not f.name.startswith((".", "_"))]
            if not files:
                continue
            size = sum(f.stat().st_size for f in files)
            mtime = max(f.stat().st_mtime_ns for f in files)
        else:
            continue
        out.append(Partition(p.relative_to(root).as_posix(), str(p), size, mtime))
    return sorted(out, key=lambda q: natural_key(q.name))


def night_key(partitions: list[Partition]) -> str:
    """A name for one night's batch of partitions (their names and sizes): a night that fails and
    runs again with the same batch finds its own checkpoints under it."""
    ident = json.dumps([[p.name, p.bytes] for p in partitions])
    return "night-" + hashlib.sha256(ident.encode()).hexdigest()[:12]


class PartitionLedger:
    """The partitions already consumed, in ``path`` (JSON)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)

    def entries(self) -> list[dict]:
        if not self.path.exists():
            return []
        data = json.loads(self.path.read_text())
        if data.get("format") != LEDGER_FORMAT:
            raise ValueError(f"{self.path} is not a retrain ledger (format {data.get('format')!r}, "
                             f"expected {LEDGER_FORMAT!r})")
        return list(data["consumed"])

    def new_partitions(self, found: list[Partition], limit: int | None = None) -> list[Partition]:
        """``found`` minus the consumed ones, oldest first, at most ``limit``."""
        done = {e["partition"]: e for e in self.entries()}
        fresh = []
        for p in found:
            seen = done.get(p.name)
            if seen is None:
                fresh.append(p)
            elif seen.get("bytes") != p.bytes:
                log.warning("partition %s changed since it was consumed (%s -> %s bytes); it is "
                            "not consumed again: give it a new name to retrain on it",
                            p.name, seen.get("bytes"), p.bytes)
        return fresh[:limit] if limit is not None else fresh

    def record(self, partitions: list[Partition], **details) -> None:
        """Add ``partitions`` (with ``details`` such as the run id and model version) and replace
        the ledger file atomically."""
        entries = self.entries()
        have = {e["partition"] for e in entries}
        now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        for p in partitions:
            if p.name in have:
                raise ValueError(f"partition {p.name} is already in the ledger {self.path}")
            d = asdict(p)
            entries.append({"partition": d.pop("name"), **d, "consumed_at": now, **details})
        self._write({"format": LEDGER_FORMAT, "consumed": entries})

    def _write(self, data: dict) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w") as fh:
                json.dump(data, fh, indent=2)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
