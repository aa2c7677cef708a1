"""Click probabilities from raw rows, as they appear in the source: what the logged MLflow model
serves (``predict`` on a DataFrame) and what batch scoring streams (``recscale.scoring.files``).

No copy of preprocessing: a block of raw rows goes through the functions preprocessing writes
with (``table_parse.parse_block``, or the Criteo TSV reader, then ``encode.encode`` with the
fitted schema: the transforms with their fitted statistics, the vocabularies, the hash rules,
the table map), the loader's decoding (``loader.columns_of``) and the model. A row that
preprocessing would reject is not scored: its reason (naming the column and the value) comes
back in its place.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from recscale.config import ConfigError, parse
from recscale.data.encode import Parsed, encode
from recscale.data.loader import columns_of, to_batch
from recscale.data.processed import PreprocessConfig, criteo_table_parsed
from recscale.data.schema import FittedSchema, criteo_schema
from recscale.data.table_parse import parse_block
from recscale.data.table_source import needed_columns
from recscale.data.vocab import Vocabulary, load_vocabulary
from recscale.evaluate.config import EvaluateConfig
from recscale.model import DLRM, model_from_resolved


def frame_to_table(frame) -> pa.Table:
    """A pandas DataFrame of raw rows -> a pyarrow Table of its columns, each as Arrow types it
    (ints, floats, strings, lists); a column that mixes kinds (a number in one row, a word in
    another) becomes text, so the parser rejects the rows it cannot read instead of the whole
    request failing."""
    arrays, names = [], []
    for name in frame.columns:
        col = frame[name]
        try:
            arr = pa.array(col, from_pandas=True)
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            arr = _as_text(col.tolist())
        arrays.append(arr)
        names.append(str(name))
    return pa.Table.from_arrays(arrays, names=names)


def _is_null(v) -> bool:
    return v is None or (isinstance(v, float) and np.isnan(v))


def _as_text(values: list) -> pa.Array:
    listy = [isinstance(v, (list, tuple, np.ndarray)) for v in values]
    if all(ok or _is_null(v) for ok, v in zip(listy, values)):
        return pa.array([None if _is_null(v) else [None if _is_null(x) else str(x) for x in v]
                         for v in values], pa.list_(pa.string()))
    return pa.array([None if _is_null(v) else str(v) for v in values], pa.string())


@dataclass
class RawScores:
    """One block's scores, a value per input row in input order."""

    probs: np.ndarray  # float64 [n]; NaN where the row was rejected
    errors: dict[int, str]  # position in the block -> why its row was not scored
    labels: np.ndarray | None  # int8 [n] where the rows carried labels (rejected rows: 0)


class RawScorer:
    """A trained model with its fitted schema and vocabulary: raw rows in, probabilities out."""

    def __init__(self, model: DLRM, fitted: FittedSchema, vocab: Vocabulary | None,
                 max_bag_size: int, batch_size: int = 4096):
        if any(f.ids == "vocab" for f in fitted.schema.sparse) and vocab is None:
            raise ValueError("the schema has ids: vocab features "
                             f"({', '.join(fitted.schema.vocab_tables)}) but no vocabulary "
                             "was given")
        self.model = model.eval()
        self.fitted, self.vocab = fitted, vocab
        self.max_bag_size, self.batch_size = int(max_bag_size), int(batch_size)

    @classmethod
    def load(cls, resolved_config: Mapping, state: Mapping[str, torch.Tensor],
             vocabulary: str | None = None, batch_size: int | None = None) -> RawScorer:
        """From what a run logs: its resolved config (which holds the fitted schema), its weights
        and its vocabulary file (``ids: vocab`` only)."""
        fitted = FittedSchema.of(resolved_config)
        vocab = load_vocabulary(vocabulary, fitted.schema.vocab_tables) if vocabulary else None
        # the run's blocks through their types: a key the type does not know stops here
        pre = parse(PreprocessConfig, resolved_config.get("preprocess"), "preprocess")
        ev = parse(EvaluateConfig, resolved_config.get("evaluate"), "evaluate")
        return cls(model_from_resolved(dict(resolved_config), dict(state)), fitted, vocab,
                   pre.max_bag_size, batch_size or ev.batch_size)

    @property
    def label(self) -> str:
        return self.fitted.schema.label_column

    def input_columns(self) -> list[str]:
        """The raw columns a row must hold (the label is optional)."""
        return [c for c in needed_columns(self.fitted.schema) if c != self.label]

    def has_labels(self, t: pa.Table) -> bool:
        """Whether rows bring labels: a label column holding at least one value (a column of
        nulls or NaN, as a frame without labels often carries, is no label)."""
        if self.label not in t.column_names:
            return False
        col = t.column(self.label)
        if pa.types.is_floating(col.type):
            col = pc.if_else(pc.is_nan(col), pa.scalar(None, col.type), col)
        return col.null_count < len(col)

    def check_columns(self, t: pa.Table) -> None:
        """Every column the model reads is there; else a ConfigError naming what is missing."""
        missing = [c for c in self.input_columns() if c not in t.column_names]
        if missing:
            raise ConfigError(f"the rows lack column(s) {', '.join(missing)}; the model reads "
                              f"{', '.join(self.input_columns())} (and {self.label!r} when "
                              "labels are given)")

    def parse(self, t: pa.Table, labels: bool | None = None) -> Parsed:
        """Raw rows -> parsed values and rejects, as preprocessing parses a table's rows;
        ``labels``: whether to read the label column (None: where ``has_labels`` says so)."""
        self.check_columns(t)
        labels = self.has_labels(t) if labels is None else labels
        if self.criteo:  # Criteo's rows by its TSV reader's rules, as preprocessing read them
            return criteo_table_parsed(t, labels)
        return parse_block(t, self.fitted.schema, self.max_bag_size, label=labels)

    @property
    def criteo(self) -> bool:
        """Whether the model was trained on the Criteo preset (its rows read by the Criteo
        reader: 8-hex-digit ids, integer counts, labels 0 and 1)."""
        schema = self.fitted.schema
        return schema == criteo_schema(ids=schema.sparse[0].ids if schema.sparse else "hash")

    @torch.no_grad()
    def score_parsed(self, p: Parsed, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray,
                                                                 np.ndarray]:
        """Parsed rows (``rows``: their row numbers) -> (rows scored, their labels, their
        probabilities), the rows ``p`` rejected left out."""
        table, _ = encode(p, self.fitted, self.vocab, rows)
        cols = columns_of(table)
        out = np.empty(len(cols), np.float64)
        for a in range(0, len(cols), self.batch_size):
            b = to_batch(cols.slice(a, min(a + self.batch_size, len(cols))))
            out[a:a + len(b.labels)] = torch.sigmoid(self.model(b.dense, b.sparse)).numpy()
        return cols.row, cols.label.astype(np.int8), out

    def score_table(self, t: pa.Table) -> RawScores:
        """A block of raw rows (a request) -> a probability (or a reason) per row, in order;
        no rows, no scores (the columns are still checked)."""
        if t.num_rows == 0:
            self.check_columns(t)
            return RawScores(np.zeros(0), {}, None)
        has_labels = self.has_labels(t)
        p = self.parse(t, has_labels)
        rows, labels, probs = self.score_parsed(p, np.arange(t.num_rows, dtype=np.int64))
        out = np.full(t.num_rows, np.nan)
        out[rows] = probs
        lab = np.zeros(t.num_rows, np.int8)
        lab[rows] = labels
        return RawScores(out, dict(p.reasons), lab if has_labels else None)
