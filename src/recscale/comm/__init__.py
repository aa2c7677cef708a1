"""Communication: autograd-aware collectives that count their bytes and time, and wire codecs."""

from recscale.comm.codecs import (
    ALLREDUCE_PRECISIONS,
    WIRE_PRECISIONS,
    CommsConfig,
    get_codec,
)
from recscale.comm.collectives import (
    CommStats,
    all_to_all_1d,
    encoded_all_to_all,
    exchange_counts,
)

__all__ = [
    "ALLREDUCE_PRECISIONS",
    "WIRE_PRECISIONS",
    "CommStats",
    "CommsConfig",
    "all_to_all_1d",
    "encoded_all_to_all",
    "exchange_counts",
    "get_codec",
]
