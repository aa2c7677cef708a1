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

import json
import logging
import os
import shutil
import time
import warnings
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from recscale.embedding import TableShard
from recscale.runconfig import CheckpointConfig
from recscale.train.checkpoint_files import (
    FORMAT_VERSION,
    MANIFEST,
    CheckpointError,
    CheckpointRefused,
    check_fingerprint,
    check_growth,
    crc32,
    list_checkpoints,
    load_dense,
    load_rng,
    load_shards,
    read_manifest,
    rng_states,
    sha256_file,
    verify_files,
)

log = logging.getLogger(__name__)
# DCP logs every save/load phase at DEBUG on its own logger; that drowns a test's captured log
logging.getLogger("c10d-NullHandler-dcp_logger").setLevel(logging.INFO)

def model_fingerprint(manifest: dict, model_cfg, train_cfg) -> dict:
    """What a checkpoint must agree on to be loaded into a model (any world size or plan)."""
    from recscale.config import to_dict
    from recscale.data.schema import FittedSchema

    fitted = FittedSchema.of(manifest)
    # which table each feature looks up, how it pools, whether its ids are weighted: a
    # checkpoint of another arrangement would load its tables and train them wrongly
    features = {"tables": list(fitted.feature_tables()), "pooling": list(fitted.pooling()),
                "weighted": list(fitted.weighted)}
    return {"table_sizes": list(manifest["table_sizes"]), "model": to_dict(model_cfg),
            "embedding_optimizer": train_cfg.embedding_optimizer.name,
            "dense_optimizer": train_cfg.dense_optimizer.name, "features": features}


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
        # checkpoints pruning leaves alone (the best validation step's, kept for the end)
        self.pinned: set[str] = set()

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
        final = self.path_of(step)
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
            if sh.average is not None:  # train.average: the average and its rows' counts
                a = sh.average.detach().cpu().contiguous()
                n = sh.average_counts.detach().cpu().contiguous()
                state[sh.key + ".a"], state[sh.key + ".n"] = a, n
                ent["average"] = {"crc": crc32(a), "counts_crc": crc32(n)}
            entries.append(ent)
        for k, v in dense.items():
            state[k] = v
        state.update(rng_states(self.rank))
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
                        files[name] = {"bytes": os.path.getsize(p), "sha256": sha256_file(p)}
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

    def path_of(self, step: int) -> str:
        """Where the checkpoint of ``step`` is written."""
        return os.path.join(self.run_dir, f"step-{step:08d}")

    def _prune(self) -> None:
        pinned = {os.path.realpath(p) for p in self.pinned}
        done = sorted(d for d in os.listdir(self.run_dir)
                      if d.startswith("step-") and not d.endswith(".tmp")
                      and os.path.realpath(os.path.join(self.run_dir, d)) not in pinned)
        for d in done[: max(0, len(done) - self.cfg.keep_last)]:
            shutil.rmtree(os.path.join(self.run_dir, d), ignore_errors=True)

    # ---------------------------------------------------------------------------- restoring
    def restore(self, targets: Sequence[TableShard], dense: torch.nn.Module,
                opt: torch.optim.Optimizer | None,
                dense_average: dict[str, torch.Tensor] | None = None) -> tuple[str, dict] | None:
        """Load the newest usable checkpoint into ``targets`` (this rank's shards, any plan),
        ``dense`` and ``opt`` (and the averages of ``train.average``: the targets' ``average``
        and ``dense_average``). -> (path, manifest), or None when there is nothing to resume.
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
                    load_dense(path, manifest, dense, opt, dense_average)
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

    def load(self, path: str, targets: Sequence[TableShard], dense: torch.nn.Module,
             opt: torch.optim.Optimizer | None,
             dense_average: dict[str, torch.Tensor] | None = None) -> dict:
        """Load the checkpoint at ``path`` (one of this run's, e.g. the best validation step's)
        into ``targets``, ``dense`` and ``opt``; the RNG and the data position stay as they are.
        -> its manifest."""
        manifest = read_manifest(path)
        check_fingerprint(path, manifest, self.fingerprint)
        if self.rank == 0 or not _distributed(self.group):
            verify_files(path, manifest, hashes=True)
        load_shards(path, manifest, targets)
        load_dense(path, manifest, dense, opt, dense_average)
        return manifest

    def init_from_checkpoint(self, targets: Sequence[TableShard], dense: torch.nn.Module,
                             opt: torch.optim.Optimizer | None,
                             dense_average: dict[str, torch.Tensor] | None = None) -> str | None:
        """``init_from``: load that checkpoint's tables, dense layers and optimizer state (any
        world size or plan), but none of its progress. -> its path, or None when unset."""
        path = self.cfg.init_from
        if not path:
            return None
        grow = self.cfg.init_grow
        if self.rank == 0 or not _distributed(self.group):
            manifest = read_manifest(path)
            want = {k: v for k, v in self.fingerprint.items() if not (grow and k == "table_sizes")}
            check_fingerprint(path, manifest, want)
            if grow:
                check_growth(path, manifest, self.fingerprint.get("table_sizes"))
            verify_files(path, manifest, hashes=True)
        if _distributed(self.group):
            dist.barrier(group=self.group)
        manifest = read_manifest(path)
        load_shards(path, manifest, targets,
                    manifest["fingerprint"]["table_sizes"] if grow else None)
        load_dense(path, manifest, dense, opt, dense_average)
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
