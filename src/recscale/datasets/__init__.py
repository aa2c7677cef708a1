"""Kedro datasets of the project (Kedro side only; the library never imports these)."""

from recscale.datasets.no_table import NoTable
from recscale.datasets.torch_state import TorchStateDictDataset

__all__ = ["NoTable", "TorchStateDictDataset"]
