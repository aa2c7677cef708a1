"""``train.checkpoint.init_grow``: a checkpoint of smaller tables (a vocabulary grown append-only)
starts a model of any other arrangement: every saved row's weights and optimizer state land
bitwise at the same rows, the rows past the checkpoint's keep the model's fresh values; without
it, or when a table would shrink, the checkpoint is refused naming why."""

import pytest
import torch

from recscale.embedding.api import TableShard
from recscale.runconfig.dlrm import CheckpointConfig
from recscale.train.checkpoint import Checkpointer, dense_tensors
from recscale.train.checkpoint_files import CheckpointError

OLD, NEW, DIM = (50, 20), (64, 25), 4


def _pieces(sizes, cuts, g):
    """Each table cut by rows at ``cuts[t]`` (table 1 also in two column halves), random weights
    and row-wise optimizer state."""
    out = []
    for t, rows in enumerate(sizes):
        bounds = [0, *cuts[t], rows]
        for a, b in zip(bounds, bounds[1:]):
            for c0, c1 in ((0, DIM),) if t == 0 else ((0, 2), (2, DIM)):
                out.append(TableShard(t, a, c0, torch.randn(b - a, c1 - c0, generator=g),
                                      [torch.rand(b - a, generator=g)]))
    return out


def _whole(pieces, sizes):
    w = [torch.full((r, DIM), float("nan")) for r in sizes]
    s = [torch.full((r,), float("nan")) for r in sizes]
    for p in pieces:
        w[p.table][p.row_offset:p.row_offset + p.weight.shape[0],
                   p.col_offset:p.col_offset + p.weight.shape[1]] = p.weight
        s[p.table][p.row_offset:p.row_offset + p.weight.shape[0]] = p.states[0]
    return w, s


@pytest.fixture
def saved(tmp_path, seed):
    g = torch.Generator().manual_seed(seed)
    pieces = _pieces(OLD, [[30], [7]], g)
    dense = torch.nn.Linear(3, 1)
    tensors, rest = dense_tensors(dense, None)
    ck = Checkpointer(CheckpointConfig(dir=str(tmp_path / "ck")), "night1",
                      fingerprint={"table_sizes": list(OLD), "model": {"m": 1}})
    path = ck.save(5, pieces, tensors, rest, {"steps": 5})
    return path, pieces, g


def _load(path, sizes, grow, g):
    targets = _pieces(sizes, [[10, 41], [12, 17]], g)  # three pieces, other offsets
    fresh = _whole(targets, sizes)
    fresh = ([w.clone() for w in fresh[0]], [s.clone() for s in fresh[1]])
    ck = Checkpointer(CheckpointConfig(dir=str(path), init_from=path, init_grow=grow), "night2",
                      fingerprint={"table_sizes": list(sizes), "model": {"m": 1}})
    ck.init_from_checkpoint(targets, torch.nn.Linear(3, 1), None)
    return _whole(targets, sizes), fresh


def test_saved_rows_land_bitwise_and_new_rows_keep_their_fresh_values(saved):
    path, pieces, g = saved
    (w, s), (w0, s0) = _load(path, NEW, True, g)
    old_w, old_s = _whole(pieces, OLD)
    for t, rows in enumerate(OLD):
        assert torch.equal(w[t][:rows], old_w[t]) and torch.equal(s[t][:rows], old_s[t])
        assert torch.equal(w[t][rows:], w0[t][rows:]) and torch.equal(s[t][rows:], s0[t][rows:])
    # the same sizes load too, every row from the checkpoint
    (w, _), _ = _load(path, OLD, True, g)
    assert all(torch.equal(a, b) for a, b in zip(w, old_w))


def test_growth_is_refused_unless_asked_and_a_shrinking_table_always(saved):
    path, _, g = saved
    with pytest.raises(CheckpointError, match=r"written for table_sizes=\[50, 20\], this run "
                                              r"has table_sizes=\[64, 25\]"):
        _load(path, NEW, False, g)
    with pytest.raises(CheckpointError, match="table 1 has 20 rows, more than this model's 19"):
        _load(path, (64, 19), True, g)
