"""The interval arithmetic that lets a resume under another world size go on with exactly the
rows of the interrupted epoch no rank had trained, and the loader over such intervals."""

import numpy as np
import pytest

from recscale.data.loader import (
    LoaderConfig,
    list_row_groups,
    make_loader,
    select_rows,
    shard_row_groups,
)
from recscale.data.work import cut, normalize, remaining, rows, share, split


def positions(work):
    return [i for a, b in work for i in range(a, b)]


def test_cut_split_and_normalize_keep_every_row_in_order():
    w = [(0, 3), (3, 5), (9, 9), (20, 24)]
    assert normalize(w) == [(0, 5), (20, 24)]
    head, tail = cut(w, 6)
    assert positions(head) == [0, 1, 2, 3, 4, 20] and positions(tail) == [21, 22, 23]
    assert cut(w, 0) == ([], [(0, 5), (20, 24)]) and cut(w, 100) == ([(0, 5), (20, 24)], [])
    pieces = split(w, 4)  # 9 rows: 2, 2, 2, 3
    assert [rows(p) for p in pieces] == [2, 2, 2, 3]
    assert sum((positions(p) for p in pieces), []) == positions(w)
    assert split([(0, 2)], 5) == [[], [], [(0, 1)], [], [(1, 2)]]  # more ranks than rows
    assert split([], 3) == [[], [], []]
    with pytest.raises(ValueError, match=r"\[5, 2\)"):
        normalize([(5, 2)])


def test_share_is_what_shard_row_groups_reads(parquet_dataset):
    refs = list_row_groups(parquet_dataset["splits"]["train"]["files"])
    for world in (1, 2, 3, 7):
        for r in range(world):
            assert select_rows(refs, share(56_000, r, world)) == shard_row_groups(refs, r, world)


@pytest.mark.parametrize("old,new,batch,batches", [
    (2, 1, 1000, 7), (2, 3, 1000, 7), (3, 2, 700, 4), (1, 5, 333, 1), (4, 3, 1000, 0)])
def test_the_rest_of_an_epoch_over_another_world_size_holds_every_row_once(old, new, batch,
                                                                           batches):
    n = 10_007
    works = [share(n, k, old) for k in range(old)]
    done = [min(batches * batch, rows(w)) for w in works]
    pieces = split(remaining(works, done), new)
    trained = sum((positions(cut(w, d)[0]) for w, d in zip(works, done, strict=True)), [])
    after = sum((positions(p) for p in pieces), [])
    assert sorted(trained + after) == list(range(n))  # every position exactly once
    assert max(rows(p) for p in pieces) - min(rows(p) for p in pieces) <= 1


def test_a_chain_of_switches_mid_epoch_loses_and_repeats_no_row():
    """2 -> 1 -> 3 ranks, each switch mid-epoch, one rank's share finished before the first."""
    n, trained = 9_001, []
    works = [[(0, 1000)], [(1000, n)]]  # uneven: rank 0 has finished at the first switch
    done = [1000, 3000]
    for w, d in zip(works, done, strict=True):
        trained += positions(cut(w, d)[0])
    (one,) = split(remaining(works, done), 1)
    assert rows(one) == n - 4000
    trained += positions(cut(one, 2500)[0])
    three = split(remaining([one], [2500]), 3)
    assert [rows(p) for p in three] == [833, 834, 834]
    done3 = [833, 800, 834]
    for w, d in zip(three, done3, strict=True):
        trained += positions(cut(w, d)[0])
    last = split(remaining(three, done3), 2)  # and back to 2: only the 34 rows rank 1 had left
    assert [rows(p) for p in last] == [17, 17]
    trained += sum((positions(p) for p in last), [])
    assert sorted(trained) == list(range(n))


def test_an_epoch_every_rank_finished_leaves_nothing():
    works = [share(100, k, 3) for k in range(3)]
    assert remaining(works, [rows(w) for w in works]) == []
    assert split(remaining(works, [rows(w) for w in works]), 2) == [[], []]
    with pytest.raises(ValueError, match="2 counts"):
        remaining(works, [1, 2])


def test_the_loader_reads_exactly_the_rows_it_is_given(parquet_dataset):
    files = parquet_dataset["splits"]["train"]["files"]
    work = [(4_990, 5_010), (30, 40), (55_990, 56_000)]  # across a row-group boundary, unordered
    got = np.concatenate([b.row_ids.numpy() for b in make_loader(
        files, LoaderConfig(batch_size=16), work)])
    assert got.tolist() == positions(work)  # the train split's row ids are its positions
    assert list(make_loader(files, LoaderConfig(batch_size=16), [])) == []
    with pytest.raises(ValueError, match="56000 rows"):
        make_loader(files, LoaderConfig(batch_size=16), [(55_000, 56_001)])
