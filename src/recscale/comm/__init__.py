"""Communication: autograd-aware collectives that count the bytes and time they spend."""

from recscale.comm.collectives import CommStats, all_to_all_1d, exchange_counts

__all__ = ["CommStats", "all_to_all_1d", "exchange_counts"]
