"""A scratch copy of the project for end-to-end `kedro run`s: its own data and MLflow store."""

import atexit
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.conftest import PROJECT_ROOT

# MLflow's set_tracking_uri / set_registry_uri write these into os.environ (for subprocesses):
# a test reading one project's store would otherwise send a later kedro run's registrations there
MLFLOW_URIS = ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")


def make_project_copy(tmp_path: Path, base_sizes_from: str | None = None) -> Path:
    """``base_sizes_from="test"``: conf/test's parameters merged into conf/base of the copy (key
    by key, as the soft merge does), so any other env (sweeps) runs at toy size too."""
    proj = tmp_path / "proj"
    proj.mkdir()
    shutil.copytree(PROJECT_ROOT / "conf", proj / "conf",
                    ignore=shutil.ignore_patterns("credentials*"))
    shutil.copytree(PROJECT_ROOT / "pipelines", proj / "pipelines")  # run configs (--config)
    if base_sizes_from:
        from omegaconf import OmegaConf

        for f in (proj / "conf" / base_sizes_from).glob("parameters*.yml"):
            base = proj / "conf" / "base" / f.name
            OmegaConf.save(OmegaConf.merge(OmegaConf.load(base), OmegaConf.load(f)), base)
    for f in ("pyproject.toml", ".telemetry"):
        shutil.copy(PROJECT_ROOT / f, proj / f)
    (proj / "src").mkdir()  # kedro checks it exists; recscale itself is the installed package
    (proj / "mlruns").mkdir()
    for d in ("mnist", "fsdd_mfcc"):  # the shipped raw data, as a fresh clone has it
        shutil.copytree(PROJECT_ROOT / "data" / "01_raw" / d, proj / "data" / "01_raw" / d)
    return proj


def _kedro_env() -> dict[str, str]:
    """This process's environment as a `kedro` command of the tests gets it."""
    env = dict(os.environ, DO_NOT_TRACK="true", KEDRO_DISABLE_TELEMETRY="true")
    env.pop("KEDRO_LOGGING_CONFIG", None)  # the copy's conf/logging.yml applies, as for a user
    for k in MLFLOW_URIS:  # mlflow.set_*_uri in this process exports them: the copy's own store
        env.pop(k, None)
    return env


def kedro(proj: Path, *args: str, timeout: int = 300, check: bool = True) -> subprocess.CompletedProcess:
    """``kedro *args`` in ``proj``: forked from this process's kedro fork server
    (``kedro_zygote.py``), or a fresh ``kedro`` process where ``RECSCALE_TEST_KEDRO_FORK=0``."""
    env = _kedro_env()
    cmd = [str(Path(sys.executable).parent / "kedro"), *args]
    if os.environ.get("RECSCALE_TEST_KEDRO_FORK", "1") != "0":
        res = _Zygote.get().run(proj, cmd, env, timeout)
    else:
        res = subprocess.run(cmd, cwd=proj, env=env, capture_output=True, text=True,
                             timeout=timeout)
    if check:
        assert res.returncode == 0, (f"kedro {' '.join(args)} failed:\n{res.stdout[-3000:]}\n"
                                     f"{res.stderr[-6000:]}")
    return res


def run_in_process(pipeline: str, env: str = "test", params: dict | None = None,
                   inputs: dict | None = None, conf: Path = PROJECT_ROOT / "conf") -> dict:
    """Run a registered pipeline with Kedro's SequentialRunner in this process, for tests where
    a ``kedro run`` CLI (and MLflow) is not the point: parameters from conf/base + conf/<env>,
    merged key by key as a run does, then ``params`` (nested, like --params); ``inputs``: the
    pipeline's other inputs by name; every other dataset in memory. -> the pipeline's outputs."""
    from kedro.config import OmegaConfigLoader
    from kedro.io import DataCatalog, MemoryDataset
    from kedro.runner import SequentialRunner

    from recscale.pipeline_registry import register_pipelines

    loader = OmegaConfigLoader(str(conf), base_env="base", default_run_env=env,
                               merge_strategy={"parameters": "soft"}, runtime_params=params)
    from recscale.datasets import NoTable

    catalog = DataCatalog({**{f"params:{k}": MemoryDataset(v)
                              for k, v in loader["parameters"].items()},
                           "raw_table": NoTable(),  # as conf/base/catalog.yml has it
                           **{k: MemoryDataset(v) for k, v in (inputs or {}).items()}})
    return SequentialRunner().run(register_pipelines()[pipeline], catalog)


class _Zygote:
    """This process's kedro fork server (started at its first command, ended with the process):
    a command's output, status and deadline as ``subprocess.run`` gives them."""

    _one: "_Zygote | None" = None
    START_TIMEOUT_S = 120

    @classmethod
    def get(cls) -> "_Zygote":
        if cls._one is None or cls._one.proc.poll() is not None:
            cls._one = cls()
        return cls._one

    def __init__(self):
        self.home = Path(tempfile.mkdtemp(prefix="recscale-kedro-zygote-"))
        # the server's own logging set-up at import: plain, as a project's (Kedro's default, rich,
        # would leave warnings captured and rich hooks installed in every command)
        (self.home / "conf").mkdir()
        (self.home / "conf" / "logging.yml").write_text(
            "version: 1\ndisable_existing_loggers: false\n")
        self.count = 0
        self.log = open(self.home / "server.log", "w")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("kedro_zygote.py"))], cwd=self.home,
            env=_kedro_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
            text=True, bufsize=1)
        atexit.register(self.close)
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.proc.stdout, selectors.EVENT_READ)
        if self._read(self.START_TIMEOUT_S) is None:
            self.proc.kill()
            raise TimeoutError(f"the kedro fork server (pid {self.proc.pid}) was not ready "
                               f"within {self.START_TIMEOUT_S} s:\n{self._log()}")

    def _log(self) -> str:
        """The end of what the server printed (its imports' output, a traceback)."""
        f = self.home / "server.log"
        return f.read_text(errors="replace")[-3000:] if f.exists() else ""

    def _read(self, timeout: float) -> dict | None:
        """The server's next answer, or None if it gave none within ``timeout`` s."""
        if not self.sel.select(timeout):
            return None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the kedro fork server ended ({self.proc.wait()}):\n"
                               f"{self._log()}")
        return json.loads(line)

    def run(self, cwd: Path, cmd: list[str], env: dict, timeout: float
            ) -> subprocess.CompletedProcess:
        self.count += 1
        out, err = self.home / f"{self.count}.out", self.home / f"{self.count}.err"
        self.proc.stdin.write(json.dumps({"cwd": str(cwd), "args": cmd[1:], "env": env,
                                          "stdout": str(out), "stderr": str(err)}) + "\n")
        self.proc.stdin.flush()
        started = self._read(30)
        if started is None:
            self.proc.kill()
            raise TimeoutError(f"the kedro fork server (pid {self.proc.pid}) did not fork "
                               f"{' '.join(cmd)} within 30 s")
        ended = self._read(timeout)
        if ended is None:  # the command and what it started, ended as subprocess.run ends it
            try:
                os.killpg(started["pid"], signal.SIGKILL)
            except ProcessLookupError:
                pass
            self._read(30)
        texts = [f.read_text(errors="replace") if f.exists() else "" for f in (out, err)]
        for f in (out, err):
            f.unlink(missing_ok=True)
        if ended is None:
            raise subprocess.TimeoutExpired(cmd, timeout, *texts)
        return subprocess.CompletedProcess(cmd, ended["rc"], *texts)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()
        shutil.rmtree(self.home, ignore_errors=True)
