"""Communication: autograd-aware collectives that count their bytes and time, wire codecs, and the
``comms`` precision config. Importing the package does not import torch (the sharding planner
reads ``recscale.comm.precision``); the torch parts load on first use."""

from recscale.comm.precision import ALLREDUCE_PRECISIONS, WIRE_PRECISIONS, CommsConfig

_LAZY = {
    "get_codec": "recscale.comm.codecs",
    "CommStats": "recscale.comm.collectives",
    "all_to_all_1d": "recscale.comm.collectives",
    "exchange_counts": "recscale.comm.collectives",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'recscale.comm' has no attribute {name!r}")


__all__ = [
    "ALLREDUCE_PRECISIONS",
    "WIRE_PRECISIONS",
    "CommStats",
    "CommsConfig",
    "all_to_all_1d",
    "exchange_counts",
    "get_codec",
]
