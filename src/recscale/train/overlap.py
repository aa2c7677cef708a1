"""Overlap policies: what the loop starts for the next batch while the current one computes.

- ``plain``: read the next batch ahead and name its ids to the embeddings' slow-tier cache
  (``prefetch``), which loads them in the background; the sharded runtime cannot route ids it has
  not distributed, so there it does nothing more.
- ``pipelined``: also start the next batch's input distribution (``start``: its ids all-to-alls go
  in flight) and prefetch from what arrived; the sharded collection additionally overlaps its
  output exchange with the bottom MLP (set when the runtime is built). In one process ``start`` is
  the identity, so both policies do the same.

Results are bitwise identical under either policy; only the timing differs.
"""

from __future__ import annotations

from recscale.data.batch import Batch
from recscale.embedding import EmbeddingCollection


class OverlapPolicy:
    def __init__(self, pipelined: bool):
        self.pipelined = pipelined

    def begin(self, emb: EmbeddingCollection, batch: Batch):
        """The first batch of an epoch: -> what the step takes as its started input (or None)."""
        return emb.start(batch.sparse) if self.pipelined else None

    def ahead(self, emb: EmbeddingCollection, nxt: Batch):
        """The next batch, while the current one computes: -> its started input (or None)."""
        if self.pipelined:
            started = emb.start(nxt.sparse)
            emb.prefetch(started)
            return started
        emb.prefetch(nxt.sparse)
        return None
