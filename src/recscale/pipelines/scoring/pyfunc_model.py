"""The registered DLRM as an MLflow pyfunc ("models from code": MLflow stores this file, not a
pickle). Input: a DataFrame of rows as preprocessing wrote them, in the parquet schema of the
retrain's splits (I1..I13 float32 = log1p of the counts; C1..C26 each id's row in its table:
with ``preprocess.ids: hash`` the 32-bit id modulo the table size, with ``ids: vocab`` its row in
the vocabulary the model was trained with, which the caller must then apply too; null = missing);
output: click probabilities. Raw rows are not taken: the caller preprocesses them as training
did. Weights are loaded with ``torch.load(weights_only=True)``.

    model = mlflow.pyfunc.load_model("models:/recscale-dlrm@champion")
    probs = model.predict(pd.read_parquet("data/05_model_input/retrain/test/part-00000.parquet"))
"""

import json
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
from mlflow.pyfunc import PythonModel


class DLRMPyfunc(PythonModel):
    def load_context(self, context) -> None:
        import torch

        from recscale.data.schema import FittedSchema
        from recscale.model import model_from_resolved

        cfg = json.loads(Path(context.artifacts["resolved_config"]).read_text())
        state = torch.load(context.artifacts["state_dict"], map_location="cpu", weights_only=True)
        self.model = model_from_resolved(cfg, state).eval()
        fitted = FittedSchema.of(cfg)  # the columns: the dataset's, as the model was trained on
        self.dense_names, self.sparse_names = fitted.dense_names, fitted.sparse_names

    def predict(self, context, model_input: pd.DataFrame, params=None) -> np.ndarray:
        import torch

        from recscale.data.loader import Columns, to_batch

        n = len(model_input)
        sparse = model_input[list(self.sparse_names)]
        cols = Columns(row=np.arange(n, dtype=np.int64), label=np.zeros(n, np.float32),
                       dense=model_input[list(self.dense_names)].to_numpy(np.float32),
                       ids=sparse.fillna(0).to_numpy(np.int64), present=sparse.notna().to_numpy(),
                       keys=self.sparse_names)
        batch = to_batch(cols)
        with torch.no_grad():
            return torch.sigmoid(self.model(batch.dense, batch.sparse)).numpy().astype(np.float64)


mlflow.models.set_model(DLRMPyfunc())
