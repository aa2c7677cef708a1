"""The logged DLRM as an MLflow pyfunc ("models from code": MLflow stores this file, not a
pickle), which every ``dlrm`` run and every retrain logs (``model_log.log_scoring_model``).

Input: a DataFrame of RAW rows, as the source holds them: ids as strings or integers, dense
values as raw numbers, multi-hot features as lists or delimited strings, the label optional.
The model carries its fitted schema (the transforms with their statistics, the hash rules, the
table map), its vocabulary and its weights (``torch.load(weights_only=True)``), and scores the
rows through the preprocessing code itself (``recscale.scoring.raw.RawScorer``). Output: a
DataFrame with the input's index, ``row`` (that index), ``probability`` (the click
probability, a float; None where the row was rejected) and ``error`` (why a row was rejected, naming the
column and the value; null where it was scored). A request of more rows than
``score.serving.max_request_rows`` (carried in the model) is refused, naming the limit.

    model = mlflow.pyfunc.load_model("models:/recscale-dlrm@champion")
    model.predict(pd.DataFrame({"I1": [3], ..., "C1": ["68fd1e64"], ...}))
"""

import json
from pathlib import Path

import mlflow
import pandas as pd
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE
from mlflow.pyfunc import PythonModel


class DLRMPyfunc(PythonModel):
    def load_context(self, context) -> None:
        import torch

        from recscale.scoring.raw import RawScorer

        cfg = json.loads(Path(context.artifacts["resolved_config"]).read_text())
        serving = json.loads(Path(context.artifacts["serving"]).read_text())
        state = torch.load(context.artifacts["state_dict"], map_location="cpu", weights_only=True)
        self.scorer = RawScorer.load(cfg, state, context.artifacts.get("vocabulary"),
                                     batch_size=serving["batch_size"])
        self.max_rows = int(serving["max_request_rows"])

    def predict(self, context, model_input: pd.DataFrame, params=None) -> pd.DataFrame:
        from recscale.config import ConfigError
        from recscale.scoring.raw import frame_to_table

        if len(model_input) > self.max_rows:
            raise MlflowException(
                f"the request holds {len(model_input)} rows, more than "
                f"score.serving.max_request_rows={self.max_rows} (the model's limit): send at "
                "most that many rows a request", INVALID_PARAMETER_VALUE)
        n, index = len(model_input), model_input.index
        try:
            got = self.scorer.score_table(frame_to_table(model_input))
        except ConfigError as exc:  # the request as a whole (a column missing): every row says
            # why in one line, here and over HTTP (where MLflow would print the whole frame)
            return pd.DataFrame({"row": index, "probability": pd.Series([None] * n, index=index,
                                                                        dtype=object),
                                 "error": pd.Series([str(exc)] * n, index=index, dtype=object)},
                                index=index)
        # None, not NaN, where a row was rejected: the served JSON stays JSON (null)
        probs = [None if i in got.errors else float(p) for i, p in enumerate(got.probs)]
        return pd.DataFrame({"row": index,
                             "probability": pd.Series(probs, index=index, dtype=object),
                             "error": pd.Series([got.errors.get(i) for i in range(n)],
                                                index=index, dtype=object)}, index=index)


mlflow.models.set_model(DLRMPyfunc())
