"""An epoch's rows as work: lists of row-position intervals, and how the rest of an interrupted
epoch is split over another number of ranks.

The rows of a split have global positions 0..N-1 (the order of ``list_row_groups`` over its
files). A rank's work in one epoch is a list of half-open intervals ``[start, stop)`` of those
positions, read in order; normally the contiguous share ``[r * N // W, (r + 1) * N // W)``. When a
run resumes mid-epoch under another world size, what every old rank had not yet read, in old-rank
order, is cut into contiguous pieces by row count, one per new rank; later epochs use the normal
shares again. Pure arithmetic: no files are read here.
"""

from __future__ import annotations

from collections.abc import Sequence

Work = list[tuple[int, int]]


def normalize(work: Sequence[Sequence[int]]) -> Work:
    """Intervals as tuples, empty ones dropped and adjacent ones merged (the rows, in the same
    order, are unchanged); refuses a malformed interval."""
    out: Work = []
    for iv in work:
        a, b = int(iv[0]), int(iv[1])
        if a < 0 or b < a:
            raise ValueError(f"row interval [{a}, {b}) is not allowed: expected 0 <= start <= stop")
        if a == b:
            continue
        if out and out[-1][1] == a:
            out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def share(total: int, rank: int, world_size: int) -> Work:
    """The normal share of ``rank``: rows [rank * N / W, (rank + 1) * N / W) (as
    ``shard_row_groups`` reads them)."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} is not allowed: expected 0 <= rank < world_size={world_size}")
    return normalize([(rank * total // world_size, (rank + 1) * total // world_size)])


def rows(work: Sequence[Sequence[int]]) -> int:
    return sum(int(b) - int(a) for a, b in work)


def cut(work: Sequence[Sequence[int]], n: int) -> tuple[Work, Work]:
    """-> (the first ``n`` rows of ``work``, the rest); ``n`` beyond its rows takes them all."""
    head: Work = []
    tail: Work = []
    left = max(0, n)
    for a, b in normalize(work):
        take = min(left, b - a)
        if take:
            head.append((a, a + take))
        if a + take < b:
            tail.append((a + take, b))
        left -= take
    return head, tail


def split(work: Sequence[Sequence[int]], world_size: int) -> list[Work]:
    """``work`` cut into ``world_size`` contiguous pieces: piece k holds its rows
    [k * R / W, (k + 1) * R / W) (so pieces differ by at most one row; some are empty when W > R)."""
    if world_size < 1:
        raise ValueError(f"world_size={world_size} is not allowed: expected >= 1")
    total = rows(work)
    out, rest, done = [], normalize(work), 0
    for k in range(world_size):
        hi = (k + 1) * total // world_size
        piece, rest = cut(rest, hi - done)
        out.append(piece)
        done = hi
    return out


def remaining(works: Sequence[Sequence[Sequence[int]]], done: Sequence[int]) -> Work:
    """What ranks with work lists ``works`` have not read after reading ``done[k]`` rows each, in
    rank order."""
    if len(works) != len(done):
        raise ValueError(f"{len(works)} work lists but {len(done)} counts of rows read")
    out: Work = []
    for w, n in zip(works, done, strict=True):
        out += cut(w, n)[1]
    return normalize(out)
