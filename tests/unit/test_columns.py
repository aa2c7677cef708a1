"""place_columns (the sharded collection's output assembly) against the index_add form it
replaces: the same output and the same gradients for every source, bitwise, with 1-D blocked
buffers and 2-D pieces, for a permutation and for summed (row-wise) columns."""

import torch

from recscale.embedding.columns import inverse_permutation, place_columns


def _reference(sources, blocks, cols, out_dim, B):
    # a 1-D source's blocks, each [B, w] row-major, side by side: rows of the blocks concatenated
    pieces = [src if src.dim() == 2 else torch.cat(
        [src[sum(widths[:k]) * B:][: B * w].reshape(B, w) for k, w in enumerate(widths)], dim=1)
        for src, widths in zip(sources, blocks)]
    wide = torch.cat(pieces, dim=1)
    return wide.new_zeros(B, out_dim).index_add(1, cols, wide)


def _check(cols, out_dim, B=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    flat_w, hier_w = (3, 0, 5), 4
    dp_w = len(cols) - sum(flat_w) - hier_w
    make = [lambda: torch.randn(B * sum(flat_w), generator=g),
            lambda: torch.randn(B, hier_w, generator=g),
            lambda: torch.randn(B, dp_w, generator=g)]
    base = [m() for m in make]
    blocks = [flat_w, (hier_w,), (dp_w,)]
    grad = torch.randn(B, out_dim, generator=g)
    got_src = [x.clone().requires_grad_() for x in base]
    ref_src = [x.clone().requires_grad_() for x in base]
    inv = inverse_permutation(cols, out_dim)
    out = place_columns(got_src, blocks, cols, inv, out_dim, B)
    ref = _reference(ref_src, blocks, cols, out_dim, B)
    assert torch.equal(out, ref)
    out.backward(grad)
    ref.backward(grad)
    for a, b in zip(got_src, ref_src):
        assert torch.equal(a.grad, b.grad)
    return inv


def test_permutation_is_gathered_both_ways():
    out_dim = 20
    cols = torch.randperm(out_dim, generator=torch.Generator().manual_seed(3))
    inv = _check(cols, out_dim)
    assert inv is not None and torch.equal(cols[inv], torch.arange(out_dim))


def test_summed_columns_keep_the_index_add():
    # two row-wise partial sums land on columns 0..3, and column 19 stays empty
    cols = torch.tensor([0, 1, 2, 3] + [0, 1, 2, 3] + list(range(4, 16)))
    assert inverse_permutation(cols, 20) is None
    _check(cols, 20)
