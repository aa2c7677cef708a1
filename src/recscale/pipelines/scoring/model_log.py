"""Logging the model that scores raw rows (``pyfunc_model.py``) into the active MLflow run:
its weights, its resolved config (which holds the fitted schema), its vocabulary and its serving
limits as artifacts, and a signature of the raw columns (any type each: the model's own parser
checks every value and rejects the rows it cannot read, naming them)."""

from __future__ import annotations

import json
import tempfile
import warnings
from pathlib import Path

import mlflow
import torch
from mlflow.models import ModelSignature
from mlflow.types.schema import AnyType, ColSpec, Schema

from recscale.data.schema import FittedSchema
from recscale.data.table_source import needed_columns

PYFUNC_CODE = Path(__file__).with_name("pyfunc_model.py")


def pip_requirements() -> list[str]:
    from importlib.metadata import PackageNotFoundError, version

    out = []
    for dist in ("torch", "fbgemm-gpu-cpu", "mlflow", "numpy", "pandas", "pyarrow", "recscale"):
        try:
            out.append(f"{dist}=={version(dist)}")
        except PackageNotFoundError:
            pass
    return out


def raw_signature(fitted: FittedSchema) -> ModelSignature:
    """The raw columns the model reads (all optional to MLflow, the label also to the model)
    -> row, probability, error."""
    # every column optional to MLflow: the model checks its columns itself and names what is
    # missing in one line (MLflow's own check answers with the whole frame printed)
    inputs = [ColSpec(AnyType(), c, required=False) for c in needed_columns(fitted.schema)]
    outputs = [ColSpec("long", "row"), ColSpec("double", "probability"),
               ColSpec("string", "error", required=False)]
    return ModelSignature(Schema(inputs), Schema(outputs))


def log_scoring_model(state: dict, resolved_config: dict, vocabulary_path: str | None,
                      serving: dict, name: str = "model",
                      registered_model_name: str | None = None):
    """Log the model into the active run (registered as a new version of
    ``registered_model_name`` where given); -> MLflow's ModelInfo."""
    fitted = FittedSchema.of(resolved_config)
    with tempfile.TemporaryDirectory() as tmp:
        paths = {"state_dict": Path(tmp) / "state_dict.pt",
                 "resolved_config": Path(tmp) / "resolved_config.json",
                 "serving": Path(tmp) / "serving.json"}
        torch.save({k: v.detach().cpu() for k, v in state.items()}, paths["state_dict"])
        paths["resolved_config"].write_text(json.dumps(resolved_config, indent=2))
        paths["serving"].write_text(json.dumps(serving, indent=2))
        if vocabulary_path:
            paths["vocabulary"] = Path(vocabulary_path)
        with warnings.catch_warnings():  # the signature documents the raw columns; an example
            # would be rows of the user's data, which the model must not carry
            warnings.filterwarnings("ignore", message=".*input example was not provided")
            return mlflow.pyfunc.log_model(
                name=name, python_model=str(PYFUNC_CODE),
                artifacts={k: str(v) for k, v in paths.items()},
                signature=raw_signature(fitted), pip_requirements=pip_requirements(),
                registered_model_name=registered_model_name)
