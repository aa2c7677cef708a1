"""Embedding tables back to their initial values, mid-run: ``train.reinit_embeddings``.

A second pass over the same rows overfits a DLRM at once (the validation AUC drops at the first
step of epoch 2: the tables have memorised their rows' labels, and the dense layers learn to
trust them). Starting every table, and its fused optimizer state, from its initial values at
each epoch after the first, while the dense layers keep training, lets those layers learn from
the rows again with tables that have not seen them (Liu et al., "Multi-Epoch Learning with Data
Augmentation for Deep Click-Through Rate Prediction", 2024). The values are exactly a freshly
built model's (``table_init``'s slice for each piece this process holds), so a one-process and a
sharded run reset to the same tables.
"""

from __future__ import annotations

import logging

import torch

from recscale.embedding.tbe import InitSlice

log = logging.getLogger(__name__)


def reset_tables(embeddings, seed: int, epoch: int | None = None) -> int:
    """Every table piece ``embeddings`` holds (``shards()``: whole tables in one process, this
    rank's shards and the replicated tables when sharded; any tier) to the initial values of a
    collection built with ``seed``, and its optimizer state to zero; durable (``flush()``).
    ``epoch``: the epoch it starts, logged. -> the rows reset."""
    shapes = embeddings.table_shapes()
    rows = 0
    with torch.no_grad():
        for sh in embeddings.shards(replicated=True):
            n, d = sh.weight.shape
            full_rows, full_dim = shapes[sh.table]
            piece = InitSlice(sh.table, full_rows, full_dim, sh.row_offset, sh.col_offset)
            for r0, block in piece.blocks(seed, n, d):
                sh.weight[r0: r0 + block.shape[0]].copy_(block.to(sh.weight.device,
                                                                  sh.weight.dtype))
            for s in sh.states:
                s.zero_()
            rows += n
    embeddings.flush()
    if epoch is not None:
        log.info("epoch %d starts from the initial embedding tables (%d rows reset: "
                 "train.reinit_embeddings)", epoch, rows)
    return rows
