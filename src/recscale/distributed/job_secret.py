"""The secret of a job across hosts: who may take part in it, and whether the job a host reads is
the one the driver published.

The driver's rendezvous store (a TCPStore) answers anyone who can reach its port, so the job spec
in it (configs, the data manifest with absolute paths, where checkpoints and the model go) could
be read or rewritten by any process on the network before a host acts on it. The driver signs the
spec with a secret shared by the job's hosts (HMAC-SHA256 over its canonical JSON, with a nonce
and the run id); ``recscale join`` and every worker verify the signature before they act on
anything in it, and refuse, naming what failed: no secret on this host, a secret other than the
driver's (told apart by a key id derived from the secret), or a spec altered after it was signed.
A verified spec's paths are then checked to lie under the roots the driver declared (its data,
output, checkpoint and scratch directories), none of them a system directory.

The secret itself never enters the store, the spec, a log line or MLflow: it comes from
``RECSCALE_JOB_SECRET``, or a file (``train.launch.secret_file`` on the driver, ``recscale join
--secret-file`` elsewhere), or, on a driver with neither, a new one written 0600 beside the job's
output (its path is logged, for copying to the other hosts). Workers get it through their
environment, set for the launch only. What it does not protect: the tensors and ids on the wire
are not encrypted (docs/multihost.md, "Trust model").
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import secrets
import stat
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

SECRET_ENV = "RECSCALE_JOB_SECRET"
SECRET_FILE = "job.secret"  # a generated secret's name, in the job's output directory
_KEY_ID_MESSAGE = b"recscale job key id"
# no root of a job may be one of these or inside one: a spec cannot point a host at them
SYSTEM_DIRS = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/proc", "/sbin",
               "/sys", "/usr")


class JobSecretError(RuntimeError):
    """The job cannot be trusted or its secret cannot be had; the message says what failed."""


# --- where the secret comes from ------------------------------------------------------------------
def _read_secret_file(path: str, key: str) -> str:
    p = Path(path)
    try:
        text = p.read_text().strip()
    except OSError as exc:
        raise JobSecretError(f"{key}={str(path)!r} cannot be read ({exc.strerror or exc}): the "
                             "job's secret file must exist on this host") from None
    if not text:
        raise JobSecretError(f"{key}={str(path)!r} is empty: the job's secret file must hold "
                             "the secret")
    mode = stat.S_IMODE(p.stat().st_mode)
    if mode & 0o077:
        log.warning("the job's secret file %s can be read by other users (mode %o): chmod 600 it",
                    path, mode)
    return text


def driver_secret(secret_file: str | None, out_dir: str) -> tuple[str, str]:
    """The driver's secret -> (secret, where it came from, for the log): ``RECSCALE_JOB_SECRET``,
    else ``secret_file`` (``train.launch.secret_file``), else a new one written 0600 to
    ``<out_dir>/job.secret``."""
    env = os.environ.get(SECRET_ENV, "").strip()
    if env:
        return env, SECRET_ENV
    if secret_file:
        return _read_secret_file(secret_file, "train.launch.secret_file"), str(secret_file)
    path = write_secret(os.path.join(out_dir, SECRET_FILE), force=True)
    secret = Path(path).read_text().strip()
    log.warning("this job's secret is new, in %s: copy it to every other host and join with "
                "`recscale join --secret-file <that file>` (or set %s there)", path, SECRET_ENV)
    return secret, path


def host_secret(secret_file: str | None) -> str:
    """A joining host's (or a worker's) secret: ``secret_file`` (``recscale join --secret-file``),
    else ``RECSCALE_JOB_SECRET``; none is an error that says how to give it."""
    if secret_file:
        return _read_secret_file(secret_file, "--secret-file")
    env = os.environ.get(SECRET_ENV, "").strip()
    if env:
        return env
    raise JobSecretError(f"this host has no secret for the job: pass --secret-file <file> (the "
                         f"driver's train.launch.secret_file, or the job.secret its log named) "
                         f"or set {SECRET_ENV}")


# --- signing --------------------------------------------------------------------------------------
def canonical(obj: Any) -> bytes:
    """The bytes a signature covers: JSON with sorted keys and no spaces, ASCII only."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def key_id(secret: str) -> str:
    """A name for the secret that gives nothing away (an HMAC of a constant): hosts whose key ids
    differ hold different secrets."""
    return hmac.new(secret.encode(), _KEY_ID_MESSAGE, hashlib.sha256).hexdigest()[:16]


def _mac(secret: str, body: dict[str, Any]) -> str:
    return hmac.new(secret.encode(), canonical(body), hashlib.sha256).hexdigest()


def sign(spec: dict[str, Any], secret: str) -> dict[str, Any]:
    """``spec`` wrapped with a nonce, its run id, the key id and the HMAC-SHA256 of all of it."""
    body = {"spec": spec, "run_id": spec["run_id"], "nonce": secrets.token_hex(16),
            "key_id": key_id(secret)}
    return {**body, "signature": _mac(secret, body)}


def verify(signed: dict[str, Any], secret: str, where: str) -> dict[str, Any]:
    """The spec of a signed job, once its signature holds; else ``JobSecretError`` naming what
    failed (``where``: the endpoint it came from)."""
    if not isinstance(signed, dict) or "signature" not in signed or "spec" not in signed:
        raise JobSecretError(f"the job at {where} is not signed: refusing to act on it (a driver "
                             "of this version signs every job; another program wrote it, or the "
                             "driver runs other code)")
    if signed.get("key_id") != key_id(secret):
        raise JobSecretError(f"this host's secret is not the driver's (the job at {where} was "
                             f"signed with key {signed.get('key_id')}, this host holds key "
                             f"{key_id(secret)}): give this host the driver's secret")
    body = {k: v for k, v in signed.items() if k != "signature"}
    if not hmac.compare_digest(str(signed["signature"]), _mac(secret, body)):
        raise JobSecretError(f"the job at {where} was altered after the driver signed it (its "
                             "signature does not match its content): refusing to act on it; "
                             "someone else can write to the driver's rendezvous store")
    spec = signed["spec"]
    if not isinstance(spec, dict) or spec.get("run_id") != signed.get("run_id"):
        raise JobSecretError(f"the job at {where} names run {spec.get('run_id')!r} inside and "
                             f"{signed.get('run_id')!r} outside: refusing to act on it")
    return spec


# --- paths ----------------------------------------------------------------------------------------
def _is_system(path: str) -> bool:
    return path == "/" or any(path == d or path.startswith(d + "/") for d in SYSTEM_DIRS)


def check_paths(roots: dict[str, str], paths: dict[str, list[str]]) -> None:
    """Every path of ``paths`` (what: [paths]) absolute, normalised and under the root of the
    same name in ``roots``, no root a system directory; else ``JobSecretError`` naming the path."""
    for name, root in roots.items():
        if not (isinstance(root, str) and os.path.isabs(root) and os.path.normpath(root) == root):
            raise JobSecretError(f"the job's {name} root {root!r} is not an absolute, normalised "
                                 "path: refusing to act on it")
        if _is_system(root):
            raise JobSecretError(f"the job's {name} root {root!r} is a system directory: "
                                 "refusing to act on it")
    for name, items in paths.items():
        root = roots.get(name)
        for p in items:
            ok = (isinstance(p, str) and os.path.isabs(p) and os.path.normpath(p) == p
                  and root is not None and (p == root or p.startswith(root.rstrip("/") + "/")))
            if not ok:
                raise JobSecretError(f"the job's path {p!r} ({name}) is not under its {name} "
                                     f"root {root!r}: refusing to act on it")


def write_secret(path: str, force: bool = False) -> str:
    """A new secret (64 hex digits) written to ``path``, readable by its owner only (0600);
    an existing file is kept unless ``force``. -> the path."""
    p = Path(path)
    if p.exists() and not force:
        raise JobSecretError(f"{path} exists: keep it (every host of a job needs the same secret) "
                             "or pass --force to write a new one")
    p.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, (secrets.token_hex(32) + "\n").encode())
    finally:
        os.close(fd)
    return str(p)


def secret_main(argv: list[str] | None = None) -> int:
    """``recscale secret --out FILE``: a new job secret for jobs across hosts."""
    import argparse
    import sys

    ap = argparse.ArgumentParser(prog="recscale secret", description="Write a new secret for "
                                 "jobs across hosts (0600): the driver reads it through "
                                 "train.launch.secret_file, every other host through `recscale "
                                 "join --secret-file`.")
    ap.add_argument("--out", default="conf/local/job.secret",
                    help="where to write it (default %(default)s, which git ignores)")
    ap.add_argument("--force", action="store_true", help="replace an existing file")
    args = ap.parse_args(argv)
    try:
        path = write_secret(args.out, args.force)
    except JobSecretError as exc:
        print(f"recscale secret: {exc}", file=sys.stderr)
        return 2
    print(f"wrote a new job secret to {path} (0600): copy it to every host of the job, as safely "
          "as any password")
    return 0
