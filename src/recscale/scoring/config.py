"""The ``score`` block (parameters_score.yml): which model, which raw files, where the scores
go, and the serving limits every logged model carries."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from recscale.config import Validated, check, check_choice
from recscale.data.source import expand_files

SOURCES = ("criteo_tsv", "table", "parquet")


@dataclass(frozen=True)
class ScoreData(Validated):
    """The raw rows to score: Criteo TSV lines, or a table's parquet or delimited text
    (``parquet``: the multi-hot Criteo parquet, read as a table), files in order (globs and
    directories allowed)."""

    source: Literal["criteo_tsv", "table", "parquet"] = "criteo_tsv"
    files: tuple[str, ...] = ("data/01_raw/synthetic/day_00.tsv",)
    delimiter: str = ","

    def validate(self, prefix: str = "score.data") -> None:
        check_choice(f"{prefix}.source", self.source, SOURCES)
        check(len(self.files) > 0, f"{prefix}.files", list(self.files),
              "at least one file, directory or glob")

    def expand(self, prefix: str = "score.data") -> list[str]:
        """The files, globs expanded in sorted order; a pattern matching nothing fails naming
        it."""
        return expand_files(self.files, f"{prefix}.files")


@dataclass(frozen=True)
class ServingConfig(Validated):
    """Carried in every logged model: the most rows one request may hold, and the rows scored
    at a time."""

    max_request_rows: int = 100_000
    batch_size: int = 16384

    def validate(self, prefix: str = "score.serving") -> None:
        check(self.max_request_rows >= 1, f"{prefix}.max_request_rows", self.max_request_rows,
              "a positive integer")
        check(self.batch_size >= 1, f"{prefix}.batch_size", self.batch_size,
              "a positive integer")


@dataclass(frozen=True)
class ScoreConfig(Validated):
    # an MLflow model URI: models:/<name>@<alias>, models:/<name>/<version>, runs:/<run>/model
    model: str = "models:/recscale-dlrm@champion"
    data: ScoreData = field(default_factory=ScoreData)
    output: str = "data/07_model_output/scores.parquet"
    chunk_bytes: int = 1 << 24  # raw text read at a time (bounds memory)
    # pyarrow: unit after unit in this process; spark: a task per unit on the active session
    engine: Literal["pyarrow", "spark"] = "pyarrow"
    progress: Literal["auto", "bar", "log", "off"] = "auto"
    serving: ServingConfig = field(default_factory=ServingConfig)

    def validate(self, prefix: str = "score") -> None:
        check(isinstance(self.model, str) and ":/" in self.model, f"{prefix}.model", self.model,
              "an MLflow model URI (models:/recscale-dlrm@champion, runs:/<run_id>/model)")
        check(self.chunk_bytes >= 1024, f"{prefix}.chunk_bytes", self.chunk_bytes, ">= 1024")
        check_choice(f"{prefix}.engine", self.engine, ("pyarrow", "spark"))
        check_choice(f"{prefix}.progress", self.progress, ("auto", "bar", "log", "off"))
