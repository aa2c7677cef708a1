"""A Kedro dataset for a torch state_dict, saved with torch.save and loaded with weights_only=True."""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Any

import torch
from kedro.io import AbstractDataset


class TorchStateDictDataset(AbstractDataset[dict, dict]):
    def __init__(self, filepath: str, metadata: dict[str, Any] | None = None):
        self._filepath = PurePosixPath(filepath)
        self.metadata = metadata

    def load(self) -> dict:
        return torch.load(self._filepath, map_location="cpu", weights_only=True)

    def save(self, data: dict) -> None:
        path = Path(self._filepath)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        torch.save({k: v.detach().cpu() for k, v in data.items()}, tmp)
        tmp.replace(path)

    def _exists(self) -> bool:
        return Path(self._filepath).exists()

    def _describe(self) -> dict[str, Any]:
        return {"filepath": str(self._filepath)}
