"""Rows no training update reached get the trained unknown row's vector.

When training ends, a row of a hashed or vocabulary table that still holds its initial value
(``table_init(seed, table, rows, dim)``, bitwise) was never updated: no train id looked it up
(a hashed row no train id lands on) or every lookup of its id was routed to the unknown row (an
id too rare to keep a row: ``recscale.data.unknown_ids``). An id that looks such a row up at
serving time is as unknown as one never seen, so the row gets the table's unknown row (row 0)
once that row was trained itself. Tables of ``ids: index`` (and bucketized dense features) are
left as they are: they have no unknown row.
"""

from __future__ import annotations

import logging

import torch

from recscale.data.schema import FittedSchema
from recscale.data.unknown_ids import UNKNOWN_ROW, UnknownIdsConfig, unknown_tables
from recscale.embedding.tbe import table_init_chunks

log = logging.getLogger(__name__)


def untrained_rows(weight: torch.Tensor, seed: int, table: int,
                   chunk_rows: int = 65536) -> torch.Tensor:
    """bool [rows]: the rows of a whole table (``weight``, on the CPU) that still equal their
    initial value, compared block by block (never a second whole table in memory)."""
    rows, dim = weight.shape
    out = torch.zeros(rows, dtype=torch.bool)
    r0 = 0
    for block in table_init_chunks(seed, table, rows, dim, chunk_rows):
        n = block.shape[0]
        out[r0: r0 + n] = (weight[r0: r0 + n] == block).all(dim=1)
        r0 += n
    return out


def fill_untrained_rows(embeddings, fitted: FittedSchema, seed: int,
                        cfg: UnknownIdsConfig | None = None) -> dict[str, int]:
    """In a trained one-process model's collection (``model.embeddings``, built with ``seed``):
    every row of a hashed or vocabulary table still at its initial value gets the table's
    trained unknown row (module docstring). -> the rows filled per table (a table whose unknown
    row never trained is left alone). ``cfg.fill`` false: nothing is done."""
    if cfg is not None and not cfg.fill:
        return {}
    filled: dict[str, int] = {}
    has_unknown = unknown_tables(fitted)
    weights = embeddings.split_weights()
    with torch.no_grad():
        for t, (name, w) in enumerate(zip(fitted.table_names, weights)):
            if not has_unknown[t] or w.shape[0] < 2:
                continue
            same = untrained_rows(w.detach().cpu(), seed, t)
            if bool(same[UNKNOWN_ROW]):  # the unknown row never trained: nothing to give
                log.warning("table %s: its unknown row %d never trained; %d untrained rows "
                            "left as they are", name, UNKNOWN_ROW, int(same.sum()))
                continue
            rows = torch.nonzero(same).flatten()
            if len(rows):
                w[rows.to(w.device)] = w[UNKNOWN_ROW].clone()
            filled[name] = int(len(rows))
    embeddings.flush()
    if filled:
        log.info("rows no training reached, given the trained unknown row: %s",
                 ", ".join(f"{n} {k}" for n, k in filled.items()))
    return filled
