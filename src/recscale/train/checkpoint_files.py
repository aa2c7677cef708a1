"""A checkpoint on disk: finding finished checkpoints, reading and verifying the manifest and
files (sizes, SHA-256, CRC-32), and loading tables (by the manifest's offsets, into any plan and
world size), dense state and RNG. ``checkpoint.py`` writes what this reads."""

from __future__ import annotations

import hashlib
import json
import os
import warnings
import zlib
from collections.abc import Sequence

import torch
import torch.distributed.checkpoint as dcp

from recscale.embedding import TableShard

MANIFEST = "manifest.json"
FORMAT_VERSION = 1


class CheckpointError(RuntimeError):
    """A checkpoint cannot be used for this model (the message says why)."""


class CheckpointRefused(CheckpointError):
    """A checkpoint is damaged: a missing or truncated file, or a checksum that does not match."""


def crc32(t: torch.Tensor) -> int:
    flat = t.detach().cpu().contiguous().reshape(-1)
    return zlib.crc32(memoryview(flat.view(torch.uint8).numpy())) if flat.numel() else 0


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


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
        if hashes and sha256_file(p) != info["sha256"]:
            raise CheckpointRefused(f"checkpoint {path}: shard file {name} fails its SHA-256 checksum")


def check_fingerprint(path: str, manifest: dict, fingerprint: dict) -> None:
    saved = manifest.get("fingerprint", {})
    for key, want in fingerprint.items():
        have = saved.get(key)
        if have is not None and have != want:
            raise CheckpointError(f"checkpoint {path} was written for {key}={have}, this run has "
                                  f"{key}={want}: it cannot be loaded into this model")


def check_growth(path: str, manifest: dict, table_sizes: Sequence[int] | None) -> None:
    """An ``init_from`` checkpoint into larger tables (a grown vocabulary): as many tables, none
    larger than the model's; else CheckpointError naming the table and both sizes."""
    saved = manifest.get("fingerprint", {}).get("table_sizes")
    if saved is None or table_sizes is None:
        raise CheckpointError(f"checkpoint {path} records no table sizes: it cannot grow into "
                              "this model's tables")
    if len(saved) != len(table_sizes):
        raise CheckpointError(f"checkpoint {path} has {len(saved)} tables, this model "
                              f"{len(table_sizes)}")
    for t, (a, b) in enumerate(zip(saved, table_sizes)):
        if int(a) > int(b):
            raise CheckpointError(f"checkpoint {path}: table {t} has {a} rows, more than this "
                                  f"model's {b}: a warm start only grows tables")


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


def load_shards(path: str, manifest: dict, targets: Sequence[TableShard],
                saved_rows: Sequence[int] | None = None) -> None:
    """Fill ``targets`` (any plan, any world size) from the checkpoint by the manifest's offsets.
    Every saved piece read is checked against its CRC-32; raises CheckpointRefused naming the
    shard whose data does not match, CheckpointError when a target region is not covered.
    ``saved_rows``: the checkpoint's table sizes when the targets' tables are larger (a grown
    vocabulary): the rows at and past them are not in the checkpoint and keep what the targets
    hold (a fresh model's rows and optimizer state). A target with an ``average``
    (``train.average``) gets the saved average and rows' counts, or the saved weights (rows not
    counting yet) where there are none."""
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
                if tg.average is not None and "average" in e:
                    request.setdefault(e["key"] + ".a", torch.empty(e["rows"], e["cols"]))
                    request.setdefault(e["key"] + ".n", torch.empty(e["rows"], dtype=torch.int32))
            for i, st in enumerate(e["states"]):
                request.setdefault(f"{e['key']}.s{i}", torch.empty(st["shape"]))
        expect = rows * cols
        if saved_rows is not None:  # only the rows the checkpoint's (smaller) table has
            expect = max(0, min(rows, int(saved_rows[tg.table]) - tg.row_offset)) * cols
        if covered != expect:
            raise CheckpointError(f"checkpoint {path}: table {tg.table} rows {tg.row_offset}.."
                                  f"{tg.row_offset + rows} columns {tg.col_offset}..{tg.col_offset + cols}"
                                  f" are not all in the checkpoint ({covered} of {rows * cols} cells)")
    if request:
        _load(request, path)
    crcs = {e["key"] + ".w": e["crc"] for e in manifest["shards"]}
    crcs.update({f"{e['key']}.s{i}": s["crc"] for e in manifest["shards"]
                 for i, s in enumerate(e["states"])})
    for e in manifest["shards"]:
        if "average" in e:
            crcs[e["key"] + ".a"] = e["average"]["crc"]
            crcs[e["key"] + ".n"] = e["average"]["counts_crc"]
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
                if tg.average is not None:  # a checkpoint without averages: from the weights,
                    # every row not yet counting
                    avg = request.get(e["key"] + ".a", request[e["key"] + ".w"])[r_s, c_s]
                    tg.average[r_t, c_t] = avg.to(tg.average.device, tg.average.dtype)
                    n = request.get(e["key"] + ".n")
                    tg.average_counts[r_t] = 0 if n is None else n[r_s].to(tg.average_counts.device)
            for i, x in enumerate(tg.states):
                saved = request[f"{e['key']}.s{i}"]
                if x.dim() == 1:  # row-wise state: one value per row, whatever the columns
                    x[r_t] = saved[r_s].to(x.device, x.dtype)
                elif co is not None:
                    x[r_t, c_t] = saved[r_s, c_s].to(x.device, x.dtype)


def load_dense(path: str, manifest: dict, dense: torch.nn.Module,
               opt: torch.optim.Optimizer | None,
               average: dict[str, torch.Tensor] | None = None) -> None:
    """Dense parameters (and optimizer state) saved by rank 0, CRC-checked. ``average``: the
    parameters' averages by name (``train.average``), filled from the checkpoint's, or from the
    saved parameters where it has none."""
    want = {f"dense.{k}": torch.empty_like(v, device="cpu") for k, v in dense.state_dict().items()}
    crc = manifest["dense_crc"]
    if average is not None:
        want.update({f"dense_avg.{k}": torch.empty_like(v, device="cpu")
                     for k, v in average.items() if f"dense_avg.{k}" in crc})
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
    with torch.no_grad():
        for k, a in (average or {}).items():
            a.copy_(want.get(f"dense_avg.{k}", want.get(f"dense.{k}")))
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


class CudaRng:
    """The CUDA generator of the current device, behind one seam (a test without a GPU puts a
    fake in ``CUDA_RNG``; DCP itself must keep seeing the real ``torch.cuda``)."""

    def available(self) -> bool:
        return torch.cuda.is_available()

    def get(self) -> torch.Tensor:
        return torch.cuda.get_rng_state()

    def set(self, state: torch.Tensor) -> None:
        torch.cuda.set_rng_state(state)


CUDA_RNG = CudaRng()


def rng_states(rank: int) -> dict[str, torch.Tensor]:
    """This rank's RNG states to save, keyed as the checkpoint stores them."""
    out = {f"rng.rank{rank}.cpu": torch.get_rng_state()}
    if CUDA_RNG.available():
        out[f"rng.rank{rank}.cuda"] = CUDA_RNG.get()
    return out


def load_rng(path: str, rank: int) -> None:
    """This rank's RNG states as saved: the CPU generator, and the CUDA generator of the current
    device when the checkpoint has one and CUDA is here (a CUDA checkpoint resumed on a CPU-only
    machine restores the CPU state only)."""
    keys = {f"rng.rank{rank}.cpu": torch.get_rng_state()}
    cuda_key = f"rng.rank{rank}.cuda"
    if cuda_key in _saved_keys(path) and CUDA_RNG.available():
        keys[cuda_key] = CUDA_RNG.get()
    _load(keys, path)
    torch.set_rng_state(keys[f"rng.rank{rank}.cpu"])
    if cuda_key in keys:
        CUDA_RNG.set(keys[cuda_key])


def _saved_keys(path: str) -> set[str]:
    return set(dcp.FileSystemReader(path).read_metadata().state_dict_metadata)
