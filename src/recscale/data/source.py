"""Where raw data comes from: generated synthetic days (Criteo TSV, or multi-hot parquet), the
user's Criteo TSV files, the user's multi-hot parquet files (``recscale.data.multihot``'s raw
format: label, I1..I13, C1..C26 as lists of ids), or the user's own table (``table``: parquet or
delimited text of any columns, read through the ``features`` schema by
``recscale.data.table_preprocess``)."""

from __future__ import annotations

import glob
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from recscale.config import ConfigError, Validated, check_choice
from recscale.data.schema import FeatureSchema
from recscale.data.synthetic import SyntheticConfig, generate_criteo_tsv
from recscale.data.synthetic_table import TableSynthConfig, generate_table


@dataclass(frozen=True)
class DataConfig(Validated):
    """The ``data`` block: where a run's raw rows come from."""

    source: Literal["synthetic", "criteo_tsv", "parquet", "table", "dataset"] = "synthetic"
    # synthetic: where the generated TSV goes
    raw_dir: str = "data/01_raw/synthetic"
    # criteo_tsv / parquet: input files in time order (globs allowed, expanded in sorted order)
    files: tuple[str, ...] = ()
    # dataset: the catalog's raw_table (any Kedro dataset of rows) is written here as parquet
    # table: the separator of text files (.csv, .tsv, .txt; their first line is the header)
    delimiter: str = ","
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)
    # synthetic with a schema of your own (features): rows drawn for that schema
    generator: TableSynthConfig = field(default_factory=TableSynthConfig)

    def validate(self, prefix: str = "data") -> None:
        check_choice(f"{prefix}.source", self.source,
                     ("synthetic", "criteo_tsv", "parquet", "table", "dataset"))
        if self.source == "table" and not self.files:
            raise ConfigError(f"{prefix}.files is empty: source 'table' needs at least one parquet "
                              "or delimited text file, directory or glob, read through the "
                              "features block's schema")
        if self.source == "criteo_tsv" and not self.files:
            raise ConfigError(f"{prefix}.files is empty: source 'criteo_tsv' needs at least one "
                              "TSV path or glob (e.g. data/01_raw/criteo/day_*.tsv)")
        if self.source == "parquet" and not self.files:
            raise ConfigError(f"{prefix}.files is empty: source 'parquet' needs at least one "
                              "multi-hot parquet path or glob (e.g. data/01_raw/mine/day_*.parquet)")


def expand_files(patterns, key: str) -> list[str]:
    """Paths, globs (expanded in sorted order) and directories, in order; a pattern that matches
    nothing fails naming it (``key[i]``)."""
    files: list[str] = []
    for i, pattern in enumerate(patterns):
        hits = sorted(glob.glob(pattern)) or ([pattern] if Path(pattern).is_dir() else [])
        if not hits:
            raise ConfigError(f"{key}[{i}]={pattern!r} matches no file")
        files += hits
    return files


def prepare_raw(cfg: DataConfig, progress: Callable[[int], None] | None = None,
                schema: FeatureSchema | None = None) -> dict:
    """The raw files of a run -> its raw manifest: generated synthetic data (a Criteo TSV, or with
    ``synthetic.multi_hot`` a multi-hot parquet, or with a ``schema`` of the user's a parquet of
    its columns (``generator``), with its oracle probabilities and labels), or the user's files
    (``files``, globs expanded in sorted order: Criteo TSV, multi-hot parquet, or a table's
    parquet or text); a pattern that matches nothing fails naming it."""
    if cfg.source == "synthetic" and schema is not None:
        rep = generate_table(schema, cfg.generator, Path(cfg.raw_dir) / "table_00.parquet",
                             progress)
        return {"source": "synthetic", "table": True, "files": [rep.path], "delimiter": ",",
                "rows": rep.num_rows, "oracle_path": rep.oracle_path,
                "labels_path": rep.labels_path, "ctr": rep.ctr, "fingerprint": rep.fingerprint}
    if cfg.source == "synthetic":
        if cfg.synthetic.multi_hot:
            from recscale.data.multihot import generate_multihot_parquet

            rep = generate_multihot_parquet(cfg.synthetic, Path(cfg.raw_dir) / "day_00.parquet",
                                            progress)
        else:
            rep = generate_criteo_tsv(cfg.synthetic, Path(cfg.raw_dir) / "day_00.tsv", progress)
        return {
            "source": "synthetic", "files": [rep.path], "multi_hot": cfg.synthetic.multi_hot, "rows": rep.num_rows,
            "oracle_path": rep.oracle_path, "labels_path": rep.labels_path, "ctr": rep.ctr,
            "cardinalities": list(rep.cardinalities), "fingerprint": rep.fingerprint,
        }
    files = expand_files(cfg.files, "data.files")
    if cfg.source == "parquet":
        return {"source": "parquet", "files": files, "multi_hot": True}
    if cfg.source == "table":
        return {"source": "table", "table": True, "files": files, "delimiter": cfg.delimiter}
    return {"source": "criteo_tsv", "files": files}
