"""Thin nodes: the typed config in, library calls, manifests and metrics out."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from recscale.config import ConfigError
from recscale.data.multihot import preprocess_multihot
from recscale.data.preprocess import preprocess_criteo, preprocess_table
from recscale.data.source import prepare_raw
from recscale.data.table_source import write_rows
from recscale.data.vocab import vocabulary_table
from recscale.evaluate.metrics import oracle_auc
from recscale.pipelines.common import as_metrics
from recscale.progress import Progress
from recscale.runconfig import DLRMConfig

log = logging.getLogger(__name__)


def generate_or_locate_raw(cfg: DLRMConfig, raw_table=None) -> dict:
    """-> the raw manifest: the rows generated, found in ``data.files``, or (``data.source:
    dataset``) loaded from the catalog's ``raw_table`` and written to parquet in
    ``data.raw_dir``."""
    if cfg.data.source == "dataset":
        if raw_table is None:
            raise ConfigError("data.source='dataset' reads the catalog entry raw_table, which "
                              "loads nothing here: set raw_table in conf/<env>/catalog.yml to "
                              "the dataset of your rows (e.g. pandas.SQLTableDataset)")
        path = Path(cfg.data.raw_dir) / "raw_table.parquet"
        with Progress(None, "reading raw_table", unit="row") as bar:
            rows = write_rows(raw_table, path, progress=bar.update)
        log.info("raw_table: %d rows -> %s", rows, path)
        return {"source": "dataset", "table": True, "files": [str(path)], "delimiter": ",",
                "rows": rows}
    own = None if isinstance(cfg.features, str) else cfg.schema
    total = None if cfg.data.source != "synthetic" else \
        cfg.data.generator.num_rows if own else cfg.data.synthetic.num_rows
    with Progress(total, "generating synthetic rows", unit="row") as bar:
        return prepare_raw(cfg.data, progress=bar.update, schema=own)


def preprocess(raw_manifest: dict, cfg: DLRMConfig):
    """-> the dataset manifest, row metrics, the vocabulary (``ids: vocab``; empty with
    ``ids: hash``) as a DataFrame and the fitted schema, which the catalog logs to MLflow."""
    if raw_manifest.get("table"):
        with Progress(None, "preprocessing rows", unit="row") as bar:
            report = preprocess_table(raw_manifest["files"], cfg.preprocess.output_dir,
                                      cfg.preprocess, cfg.schema, raw_manifest["delimiter"],
                                      progress=bar.update)
    else:
        with Progress(None, "preprocessing lines", unit="line") as bar:
            run = preprocess_multihot if raw_manifest.get("multi_hot") else preprocess_criteo
            report = run(raw_manifest["files"], cfg.preprocess.output_dir, cfg.preprocess,
                         table_size_hint=raw_manifest.get("cardinalities"), progress=bar.update)
    with open(report.manifest_path) as fh:
        manifest = {"manifest_path": report.manifest_path, **json.load(fh)}
    metrics = {"lines_read": report.lines_read, "rows_written": report.rows_written,
               "rows_rejected": report.rows_rejected,
               **{f"rows_{k}": v for k, v in report.split_rows.items()}}
    if "labels_path" in raw_manifest:  # generated rows: the true probabilities' AUC on them
        metrics["oracle_auc_all_rows"] = oracle_auc(raw_manifest)
        log.info("generated rows: oracle AUC %.4f over all %d (the true probabilities on their "
                 "labels)", metrics["oracle_auc_all_rows"], report.lines_read)
    vocabulary = vocabulary_table(manifest.get("vocabulary_path")).to_pandas()
    return manifest, as_metrics(metrics), vocabulary, manifest["schema"]
