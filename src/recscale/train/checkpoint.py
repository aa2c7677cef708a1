"""Sharded checkpoints: every rank's embedding shards (weights and fused-optimizer state, any
memory tier), the dense parameters and optimizer, the data-loader position, RNG states and step.

Layout: ``<dir>/<run_id>/step-00000120/`` holds torch.distributed.checkpoint (DCP) files, each
rank writing its own keys, and ``manifest.json``: every shard's table, row/column offsets and
CRC-32, every file's size and SHA-256, the model fingerprint, and per-rank loader state.

Writes are atomic: everything goes to ``step-XXXXXXXX.tmp`` (DCP fsyncs its files), the manifest
is written, fsynced and renamed, then the directory is renamed to its final name and the parent
fsynced. A directory without a manifest is never a checkpoint, so a write that fails half way (a
full disk) leaves the previous checkpoint as the latest. Only the last ``keep_last`` are kept.

Loading reads by the manifest's offsets, so a checkpoint written by W1 ranks under plan P1 loads
into W2 ranks under plan P2 (or into the single-process model): each new shard copies the
overlapping regions of the saved shards. A checkpoint whose files are missing, the wrong size or
fail their checksum is refused with a message naming the file or shard, and the previous one is
used.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
import warnings
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from recscale.config import Validated, check
from recscale.embedding import TableShard

log = logging.getLogger(__name__)
# DCP logs every save/load phase at DEBUG on its own logger; that drowns a test's captured log
logging.getLogger("c10d-NullHandler-dcp_logger").setLevel(logging.INFO)

MANIFEST = "manifest.json"
FORMAT_VERSION = 1
RESUME_MODES = ("restart", "latest", "never")


@dataclass(frozen=True)
class CheckpointConfig(Validated):
    """``train.checkpoint``: where and how often to checkpoint, and what to resume from."""

    dir: str | None = None  # null: no checkpoints
    every_steps: int = 0  # 0: only at the end of training
    keep_last: int = 2
    # restart: resume only from this launch's own checkpoints (elastic restarts after a failure);
    # latest: the newest valid checkpoint under dir, of any run (continue a stopped job, or
    # reshard it to another world size); never; or the path of one step directory
    resume: str = "restart"
    # a checkpoint (step directory) whose model and optimizer state start this run when there is
    # nothing to resume: a warm start on new data, counters and data position from zero
    init_from: str | None = None

    def validate(self, prefix: str = "train.checkpoint") -> None:
        check(self.every_steps >= 0, f"{prefix}.every_steps", self.every_steps, ">= 0 (0: at the end only)")
        check(self.keep_last >= 1, f"{prefix}.keep_last", self.keep_last, ">= 1")
        check(self.resume in RESUME_MODES or os.sep in self.resume or self.resume.startswith("step-"),
              f"{prefix}.resume", self.resume,
              f"one of {RESUME_MODES} or the path of a checkpoint's step directory")


class CheckpointError(RuntimeError):
    """A checkpoint cannot be used for this model (the message says why)."""


class CheckpointRefused(CheckpointError):
    """A checkpoint is damaged: a missing or truncated file, or a checksum that does not match."""


def model_fingerprint(manifest: dict, model_cfg, train_cfg) -> dict:
    """What a checkpoint must agree on to be loaded into a model (any world size or plan)."""
    from recscale.config import to_dict

    return {"table_sizes": list(manifest["table_sizes"]), "model": to_dict(model_cfg),
            "embedding_optimizer": train_cfg.embedding_optimizer.name,
            "dense_optimizer": train_cfg.dense_optimizer.name}


def crc32(t: torch.Tensor) -> int:
    flat = t.detach().cpu().contiguous().reshape(-1)
    return zlib.crc32(memoryview(flat.view(torch.uint8).numpy())) if flat.numel() else 0


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_json_atomic(path: str, obj: Any) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(obj, fh, indent=1, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _distributed(group) -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1


def dense_tensors(dense: torch.nn.Module, opt: torch.optim.Optimizer | None) -> tuple[dict, dict]:
    """-> (tensors to save under 'dense.*' / 'dense_opt.*', JSON-able rest of the optimizer)."""
    tensors = {f"dense.{k}": v.detach().cpu() for k, v in dense.state_dict().items()}
    rest: dict[str, Any] = {"param_groups": [], "scalars": {}}
    if opt is not None:
        sd = opt.state_dict()
        rest["param_groups"] = sd["param_groups"]
        for pid, st in sd["state"].items():
            for name, v in st.items():
                if torch.is_tensor(v):
                    tensors[f"dense_opt.{pid}.{name}"] = v.detach().cpu()
                else:
                    rest["scalars"][f"{pid}.{name}"] = v
    return tensors, rest


class Checkpointer:
    """Saves and restores one run's checkpoints. Every rank makes the same calls in the same
    order (the save is a collective when there are several ranks)."""

    def __init__(self, cfg: CheckpointConfig, run_id: str, rank: int = 0, world_size: int = 1,
                 group=None, fingerprint: dict | None = None):
        if cfg.dir is None:
            raise ValueError("train.checkpoint.dir is null: checkpoints are off")
        self.cfg, self.run_id, self.rank, self.world_size = cfg, run_id, rank, world_size
        self.group = group
        self.fingerprint = fingerprint or {}
        self.run_dir = os.path.join(cfg.dir, run_id)
        self.saved: list[str] = []
        self.last_saved_step: int | None = None
        self.failed_writes = 0
        self.save_seconds = 0.0

    # ------------------------------------------------------------------------------ saving
    def due(self, step: int) -> bool:
        return self.cfg.every_steps > 0 and step % self.cfg.every_steps == 0

    def save(self, step: int, shards: Sequence[TableShard], dense: dict[str, torch.Tensor],
             dense_rest: dict, progress: dict, loader_state: Any = None) -> str | None:
        """Write a checkpoint of ``step``. ``dense``/``dense_rest``: rank 0's dense state (other
        ranks pass {}); ``progress``: JSON-able counters (epoch, batches, samples...);
        ``loader_state``: this rank's data-loader state. -> the checkpoint's path, or None when
        the write failed (logged; the previous checkpoint stays the latest)."""
        t0 = time.perf_counter()
        final = os.path.join(self.run_dir, f"step-{step:08d}")
        tmp = final + ".tmp"
        dist_on = _distributed(self.group)
        if self.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)  # a leftover of a crashed attempt
            os.makedirs(tmp, exist_ok=True)
        if dist_on:
            dist.barrier(group=self.group)
        state: dict[str, torch.Tensor] = {}
        entries = []
        for sh in shards:
            w = sh.weight.detach().cpu().contiguous()
            state[sh.key + ".w"] = w
            ent = {"key": sh.key, "table": sh.table, "row_offset": sh.row_offset,
                   "rows": int(w.shape[0]), "col_offset": sh.col_offset, "cols": int(w.shape[1]),
                   "crc": crc32(w), "states": []}
            for i, x in enumerate(sh.states):
                x = x.detach().cpu().contiguous()
                state[f"{sh.key}.s{i}"] = x
                ent["states"].append({"shape": list(x.shape), "crc": crc32(x)})
            entries.append(ent)
        for k, v in dense.items():
            state[k] = v
        rng = {"cpu": torch.get_rng_state()}
        if torch.cuda.is_available():
            rng["cuda"] = torch.cuda.get_rng_state()
        for k, v in rng.items():
            state[f"rng.rank{self.rank}.{k}"] = v
        dense_crc = {k: crc32(v) for k, v in dense.items()}
        ok, err = True, ""
        try:
            with warnings.catch_warnings():  # "assuming ... a single process": yes
                warnings.simplefilter("ignore", UserWarning)
                dcp.save(state, storage_writer=dcp.FileSystemWriter(tmp, sync_files=True),
                         process_group=self.group, no_dist=not dist_on)
        except (Exception, CheckpointException) as exc:  # e.g. OSError(ENOSPC); DCP reports a
            # failure on any rank to every rank (CheckpointException is a BaseException)
            lines = [x for x in str(exc).strip().splitlines() if x.strip()]
            ok, err = False, (lines[-1].strip() if lines else type(exc).__name__)[:500]
        files = {}
        if ok:
            try:
                for name in sorted(os.listdir(tmp)):
                    if name.startswith(f"__{self.rank}_") or (self.rank == 0 and name == ".metadata"):
                        p = os.path.join(tmp, name)
                        files[name] = {"bytes": os.path.getsize(p), "sha256": _sha256(p)}
            except OSError as exc:
                ok, err = False, f"{type(exc).__name__}: {exc}"
        mine = {"ok": ok, "err": err, "files": files, "shards": entries, "dense_crc": dense_crc,
                "loader": loader_state, "rank": self.rank, "progress": progress}
        parts = [None] * self.world_size
        if dist_on:
            dist.all_gather_object(parts, mine, group=self.group)
        else:
            parts = [mine]
        ok = all(p["ok"] for p in parts)
        if ok and self.rank == 0:
            try:
                manifest = {
                    "format": FORMAT_VERSION, "run_id": self.run_id, "step": step,
                    "created": time.time(), "world_size": self.world_size,
                    "fingerprint": self.fingerprint,
                    "progress": {str(p["rank"]): p["progress"] for p in parts},
                    "dense_rest": dense_rest,
                    "dense_crc": {k: v for p in parts for k, v in p["dense_crc"].items()},
                    "files": {k: v for p in parts for k, v in p["files"].items()},
                    "shards": [e for p in parts for e in p["shards"]],
                    "loader": {str(p["rank"]): p["loader"] for p in parts},
                }
                _write_json_atomic(os.path.join(tmp, MANIFEST), manifest)
                _fsync_dir(tmp)
                if os.path.exists(final):
                    shutil.rmtree(final)
                os.replace(tmp, final)
                _fsync_dir(self.run_dir)
            except Exception as exc:
                ok, err = False, f"{type(exc).__name__}: {exc}"
        if dist_on:  # (an object collective: works on gloo and NCCL alike)
            box = [ok]
            dist.broadcast_object_list(box, src=0, group=self.group)
            ok = bool(box[0])
        if not ok:
            self.failed_writes += 1
            if self.rank == 0:
                shutil.rmtree(tmp, ignore_errors=True)
                errs = "; ".join(f"rank {p['rank']}: {p['err']}" for p in parts if p["err"]) or err
                log.error("checkpoint of step %d was NOT written (%s); the previous checkpoint %s "
                          "stays the latest", step, errs, self.saved[-1] if self.saved else "(none)")
            self.save_seconds += time.perf_counter() - t0
            return None
        self.saved.append(final)
        self.last_saved_step = step
        if self.rank == 0:
            self._prune()
            log.info("checkpoint of step %d written to %s", step, final)
        self.save_seconds += time.perf_counter() - t0
        return final

    def _prune(self) -> None:
        done = sorted(d for d in os.listdir(self.run_dir)
                      if d.startswith("step-") and not d.endswith(".tmp"))
        for d in done[: max(0, len(done) - self.cfg.keep_last)]:
            shutil.rmtree(os.path.join(self.run_dir, d), ignore_errors=True)

    # ---------------------------------------------------------------------------- restoring
    def restore(self, targets: Sequence[TableShard], dense: torch.nn.Module,
                opt: torch.optim.Optimizer | None) -> tuple[str, dict] | None:
        """Load the newest usable checkpoint into ``targets`` (this rank's shards, any plan),
        ``dense`` and ``opt``. -> (path, manifest), or None when there is nothing to resume.
        A damaged checkpoint is refused (logged, naming the file or shard) and the previous one
        is tried; every rank takes the same decision."""
        dist_on = _distributed(self.group)
        cands = self.candidates() if self.rank == 0 else None
        if dist_on:
            box = [cands]
            dist.broadcast_object_list(box, src=0, group=self.group)
            cands = box[0]
        refused, touched = [], False
        for path in cands:
            err = ""
            manifest = None
            try:
                manifest = read_manifest(path)
                try:
                    check_fingerprint(path, manifest, self.fingerprint)
                except CheckpointError:
                    if self.cfg.resume == "latest":  # another model's run in the same folder
                        log.warning("skipping checkpoint %s: written for another model", path)
                        continue
                    raise
                # rank 0 checks every file's SHA-256 before anything is loaded; all ranks then
                # check the CRC of each piece they read
                if self.rank == 0:
                    verify_files(path, manifest, hashes=True)
            except CheckpointRefused as exc:
                err = str(exc)
            if dist_on:
                box = [err]
                dist.broadcast_object_list(box, src=0, group=self.group)
                err = box[0]
            if not err:
                touched = True
                try:
                    load_shards(path, manifest, targets)
                    load_dense(path, manifest, dense, opt)
                    if manifest["world_size"] == self.world_size:
                        load_rng(path, self.rank)
                except CheckpointRefused as exc:
                    err = str(exc)
                if dist_on:
                    errs = [None] * self.world_size
                    dist.all_gather_object(errs, err, group=self.group)
                    err = next((e for e in errs if e), "")
            if not err:
                if refused and self.rank == 0:
                    log.warning("resumed from the previous checkpoint %s", path)
                return path, manifest
            refused.append(err)
            if self.rank == 0:
                log.error("checkpoint refused: %s; trying the previous one", err)
        if refused and (touched or self.cfg.resume != "restart"):
            raise CheckpointError("no usable checkpoint to resume from: " + " | ".join(refused))
        if refused and self.rank == 0:
            log.error("every checkpoint of this run was refused; training starts from step 0")
        return None

    def init_from_checkpoint(self, targets: Sequence[TableShard], dense: torch.nn.Module,
                             opt: torch.optim.Optimizer | None) -> str | None:
        """``init_from``: load that checkpoint's tables, dense layers and optimizer state (any
        world size or plan), but none of its progress. -> its path, or None when unset."""
        path = self.cfg.init_from
        if not path:
            return None
        if self.rank == 0 or not _distributed(self.group):
            manifest = read_manifest(path)
            check_fingerprint(path, manifest, self.fingerprint)
            verify_files(path, manifest, hashes=True)
        if _distributed(self.group):
            dist.barrier(group=self.group)
        manifest = read_manifest(path)
        load_shards(path, manifest, targets)
        load_dense(path, manifest, dense, opt)
        if self.rank == 0:
            log.info("initialised from checkpoint %s (step %d of run %s): model and optimizer "
                     "state, counters from zero", path, manifest["step"], manifest["run_id"])
        return path

    # ----------------------------------------------------------------------------- choosing
    def candidates(self) -> list[str]:
        """Checkpoints to resume from, newest first, as ``train.checkpoint.resume`` says."""
        mode = self.cfg.resume
        if mode == "never":
            return []
        if mode == "restart":
            return list_checkpoints(self.run_dir)
        if mode == "latest":
            return list_checkpoints(self.cfg.dir, all_runs=True)
        path = mode if os.path.isabs(mode) or os.path.exists(mode) else os.path.join(self.cfg.dir, mode)
        if not os.path.isdir(path):
            raise CheckpointError(f"train.checkpoint.resume={mode!r}: no such checkpoint directory")
        return [path]


def list_checkpoints(root: str, all_runs: bool = False) -> list[str]:
    """Finished checkpoints (a manifest present) under ``root``, newest first."""
    if not root or not os.path.isdir(root):
        return []
    dirs = [os.path.join(root, r) for r in os.listdir(root)] if all_runs else [root]
    found = []
    for d in dirs:
        if not os.path.isdir(d):
            continue
        for name in os.listdir(d):
            p = os.path.join(d, name)
            if name.startswith("step-") and not name.endswith(".tmp") and os.path.isfile(
                    os.path.join(p, MANIFEST)):
                found.append((os.path.getmtime(os.path.join(p, MANIFEST)), name, p))
    return [p for _, _, p in sorted(found, reverse=True)]


def read_manifest(path: str) -> dict:
    mp = os.path.join(path, MANIFEST)
    try:
        with open(mp) as fh:
            manifest = json.load(fh)
    except (OSError, ValueError) as exc:
        raise CheckpointRefused(f"checkpoint {path}: manifest {mp} is unreadable ({exc})") from exc
    if manifest.get("format") != FORMAT_VERSION:
        raise CheckpointRefused(f"checkpoint {path}: manifest format {manifest.get('format')!r}, "
                                f"this version reads {FORMAT_VERSION}")
    return manifest


def verify_files(path: str, manifest: dict, hashes: bool = True) -> None:
    """Every file the manifest lists exists with its size and SHA-256; raises CheckpointRefused
    naming the first that does not."""
    for name, info in sorted(manifest["files"].items()):
        p = os.path.join(path, name)
        if not os.path.isfile(p):
            raise CheckpointRefused(f"checkpoint {path}: shard file {name} is missing")
        size = os.path.getsize(p)
        if size != info["bytes"]:
            raise CheckpointRefused(f"checkpoint {path}: shard file {name} has {size} bytes, "
                                    f"the manifest says {info['bytes']}")
        if hashes and _sha256(p) != info["sha256"]:
            raise CheckpointRefused(f"checkpoint {path}: shard file {name} fails its SHA-256 checksum")


def check_fingerprint(path: str, manifest: dict, fingerprint: dict) -> None:
    saved = manifest.get("fingerprint", {})
    for key, want in fingerprint.items():
        have = saved.get(key)
        if have is not None and have != want:
            raise CheckpointError(f"checkpoint {path} was written for {key}={have}, this run has "
                                  f"{key}={want}: it cannot be loaded into this model")


# ---------------------------------------------------------------------------------- loading
def _overlap(a0: int, an: int, b0: int, bn: int) -> tuple[int, int] | None:
    lo, hi = max(a0, b0), min(a0 + an, b0 + bn)
    return (lo, hi) if lo < hi else None


def _load(state: dict, path: str) -> None:
    """Read ``state``'s keys from the checkpoint, in this process alone (each rank reads what its
    own shards need, whatever the world size that wrote it)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(state, storage_reader=dcp.FileSystemReader(path), no_dist=True)


def load_shards(path: str, manifest: dict, targets: Sequence[TableShard]) -> None:
    """Fill ``targets`` (any plan, any world size) from the checkpoint by the manifest's offsets.
    Every saved piece read is checked against its CRC-32; raises CheckpointRefused naming the
    shard whose data does not match, CheckpointError when a target region is not covered."""
    by_table: dict[int, list[dict]] = {}
    for e in manifest["shards"]:
        by_table.setdefault(e["table"], []).append(e)
    plan = []  # (target, saved entry, rows overlap, cols overlap)
    request: dict[str, torch.Tensor] = {}
    for tg in targets:
        rows, cols = tg.weight.shape
        covered = 0
        for e in by_table.get(tg.table, []):
            ro = _overlap(tg.row_offset, rows, e["row_offset"], e["rows"])
            co = _overlap(tg.col_offset, cols, e["col_offset"], e["cols"])
            if ro is None:
                continue
            if len(e["states"]) != len(tg.states):
                raise CheckpointError(f"checkpoint {path}: table {tg.table} was saved with "
                                      f"{len(e['states'])} optimizer state(s), this model has "
                                      f"{len(tg.states)} (another embedding optimizer?)")
            plan.append((tg, e, ro, co))
            if co is not None:
                covered += (ro[1] - ro[0]) * (co[1] - co[0])
                request.setdefault(e["key"] + ".w", torch.empty(e["rows"], e["cols"]))
            for i, st in enumerate(e["states"]):
                request.setdefault(f"{e['key']}.s{i}", torch.empty(st["shape"]))
        if covered != rows * cols:
            raise CheckpointError(f"checkpoint {path}: table {tg.table} rows {tg.row_offset}.."
                                  f"{tg.row_offset + rows} columns {tg.col_offset}..{tg.col_offset + cols}"
                                  f" are not all in the checkpoint ({covered} of {rows * cols} cells)")
    if request:
        _load(request, path)
    crcs = {e["key"] + ".w": e["crc"] for e in manifest["shards"]}
    crcs.update({f"{e['key']}.s{i}": s["crc"] for e in manifest["shards"]
                 for i, s in enumerate(e["states"])})
    for key, t in request.items():
        if crc32(t) != crcs[key]:
            raise CheckpointRefused(f"checkpoint {path}: shard {key} fails its CRC-32 checksum")
    with torch.no_grad():
        for tg, e, ro, co in plan:
            r_t = slice(ro[0] - tg.row_offset, ro[1] - tg.row_offset)
            r_s = slice(ro[0] - e["row_offset"], ro[1] - e["row_offset"])
            if co is not None:
                c_t = slice(co[0] - tg.col_offset, co[1] - tg.col_offset)
                c_s = slice(co[0] - e["col_offset"], co[1] - e["col_offset"])
                src = request[e["key"] + ".w"][r_s, c_s]
                tg.weight[r_t, c_t] = src.to(tg.weight.device, tg.weight.dtype)
            for i, x in enumerate(tg.states):
                saved = request[f"{e['key']}.s{i}"]
                if x.dim() == 1:  # row-wise state: one value per row, whatever the columns
                    x[r_t] = saved[r_s].to(x.device, x.dtype)
                elif co is not None:
                    x[r_t, c_t] = saved[r_s, c_s].to(x.device, x.dtype)


def load_dense(path: str, manifest: dict, dense: torch.nn.Module,
               opt: torch.optim.Optimizer | None) -> None:
    """Dense parameters (and optimizer state) saved by rank 0, CRC-checked."""
    want = {f"dense.{k}": torch.empty_like(v, device="cpu") for k, v in dense.state_dict().items()}
    crc = manifest["dense_crc"]
    if opt is not None:
        want.update({k: None for k in crc if k.startswith("dense_opt.")})
    missing = [k for k in want if k not in crc]
    if missing:
        raise CheckpointError(f"checkpoint {path} has no {missing[0]} (a different dense model?)")
    meta = dcp.FileSystemReader(path).read_metadata()
    for k in want:
        if want[k] is None:
            md = meta.state_dict_metadata[k]
            want[k] = torch.empty(md.size, dtype=md.properties.dtype)
    _load(want, path)
    for k, v in want.items():
        if crc32(v) != crc[k]:
            raise CheckpointRefused(f"checkpoint {path}: dense tensor {k} fails its CRC-32 checksum")
    dense.load_state_dict({k[len("dense."):]: v for k, v in want.items() if k.startswith("dense.")})
    if opt is not None:
        rest = manifest["dense_rest"]
        state: dict[int, dict] = {}
        for k, v in want.items():
            if k.startswith("dense_opt."):
                _, pid, name = k.split(".", 2)
                state.setdefault(int(pid), {})[name] = v
        for k, v in rest["scalars"].items():
            pid, name = k.split(".", 1)
            state.setdefault(int(pid), {})[name] = v
        opt.load_state_dict({"state": state, "param_groups": rest["param_groups"]})


def load_rng(path: str, rank: int) -> None:
    """This rank's RNG states as saved: the CPU generator, and the CUDA generator of the current
    device when the checkpoint has one and CUDA is here (a CUDA checkpoint resumed on a CPU-only
    machine restores the CPU state only)."""
    keys = {f"rng.rank{rank}.cpu": torch.get_rng_state()}
    cuda_key = f"rng.rank{rank}.cuda"
    has_cuda = cuda_key in _saved_keys(path)
    if has_cuda and torch.cuda.is_available():
        keys[cuda_key] = torch.cuda.get_rng_state()
    _load(keys, path)
    torch.set_rng_state(keys[f"rng.rank{rank}.cpu"])
    if cuda_key in keys:
        torch.cuda.set_rng_state(keys[cuda_key])


def _saved_keys(path: str) -> set[str]:
    return set(dcp.FileSystemReader(path).read_metadata().state_dict_metadata)
