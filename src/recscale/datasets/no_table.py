"""The catalog's ``raw_table`` when a run reads no table from the catalog: loads ``None``.

An env whose ``data.source`` is ``dataset`` replaces the entry in its catalog.yml with the Kedro
dataset that holds its rows (``pandas.SQLTableDataset``, ``pandas.SQLQueryDataset`` with
``load_args: {chunksize: ...}``, ``pandas.ParquetDataset``, ...)."""

from __future__ import annotations

from typing import Any

from kedro.io import AbstractDataset


class NoTable(AbstractDataset[None, None]):
    def __init__(self, metadata: dict[str, Any] | None = None):
        self.metadata = metadata

    def load(self) -> None:
        return None

    def save(self, data: None) -> None:
        raise NotImplementedError("raw_table is read-only: set it to the dataset of your rows")

    def _describe(self) -> dict[str, Any]:
        return {"raw_table": "none (data.source: dataset reads the dataset set here)"}
