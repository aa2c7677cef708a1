"""A scratch copy of the project for end-to-end `kedro run`s: its own data and MLflow store."""

import os
import shutil
import subprocess
import sys
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


def kedro(proj: Path, *args: str, timeout: int = 300, check: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ, DO_NOT_TRACK="true", KEDRO_DISABLE_TELEMETRY="true")
    env.pop("KEDRO_LOGGING_CONFIG", None)  # the copy's conf/logging.yml applies, as for a user
    for k in MLFLOW_URIS:  # mlflow.set_*_uri in this process exports them: the copy's own store
        env.pop(k, None)
    cmd = [str(Path(sys.executable).parent / "kedro"), *args]
    res = subprocess.run(cmd, cwd=proj, env=env, capture_output=True, text=True, timeout=timeout)
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
