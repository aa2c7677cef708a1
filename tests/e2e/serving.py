"""The real `mlflow models serve` on loopback for a test: started with a deadline (its log shown
when it fails to answer), asked over HTTP, stopped afterwards."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def served(proj: Path, uri: str, log_path: Path, timeout_s: float = 120):
    """-> the base URL of ``uri`` served from ``proj``'s MLflow store."""
    bindir = Path(sys.executable).parent
    port = free_port()
    store = f"sqlite:///{proj}/mlruns/mlflow.db"
    env = dict(os.environ, PATH=f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}",
               MLFLOW_TRACKING_URI=store, MLFLOW_REGISTRY_URI=store, DO_NOT_TRACK="true")
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [str(bindir / "mlflow"), "models", "serve", "-m", uri, "--env-manager", "local",
             "-h", "127.0.0.1", "-p", str(port)], cwd=proj, env=env, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if urllib.request.urlopen(f"{base}/ping", timeout=2).status == 200:
                    break
            except OSError:
                pass
            if proc.poll() is not None:
                raise AssertionError(f"mlflow models serve exited ({proc.returncode}) before "
                                     f"answering:\n{log_path.read_text()[-4000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"mlflow models serve did not answer /ping on {base} "
                                     f"within {timeout_s:.0f} s:\n{log_path.read_text()[-4000:]}")
            time.sleep(0.3)
        yield base
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=15)


def invoke(base: str, frame) -> tuple[int, dict]:
    """POST ``frame`` as MLflow's ``dataframe_split`` JSON -> (HTTP status, the JSON answer)."""
    body = json.dumps({"dataframe_split": json.loads(frame.to_json(orient="split",
                                                                   index=False))}).encode()
    req = urllib.request.Request(f"{base}/invocations", data=body,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")
