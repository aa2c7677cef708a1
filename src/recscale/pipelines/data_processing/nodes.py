"""Thin nodes: typed configs in, library calls, manifests and metrics out."""

from __future__ import annotations

from recscale.config import parse
from recscale.data.preprocess import PreprocessConfig, preprocess_criteo
from recscale.data.source import DataConfig, prepare_raw
from recscale.pipelines.common import as_metrics
from recscale.progress import Progress


def generate_or_locate_raw(data_params: dict) -> dict:
    cfg = parse(DataConfig, data_params, "data")
    total = cfg.synthetic.num_rows if cfg.source == "synthetic" else None
    with Progress(total, "generating synthetic rows", unit="row") as bar:
        return prepare_raw(cfg, progress=bar.update)


def preprocess(raw_manifest: dict, preprocess_params: dict) -> tuple[dict, dict]:
    params = dict(preprocess_params)
    out_dir = params.pop("output_dir")
    cfg = parse(PreprocessConfig, params, "preprocess")
    with Progress(None, "preprocessing lines", unit="line") as bar:
        report = preprocess_criteo(
            raw_manifest["files"], out_dir, cfg,
            table_size_hint=raw_manifest.get("cardinalities"),
            progress=bar.update,
        )
    manifest = {"manifest_path": report.manifest_path, **_read(report.manifest_path)}
    metrics = {
        "lines_read": report.lines_read,
        "rows_written": report.rows_written,
        "rows_rejected": report.rows_rejected,
        **{f"rows_{k}": v for k, v in report.split_rows.items()},
    }
    if "oracle_auc" in raw_manifest:
        metrics["oracle_auc_all_rows"] = raw_manifest["oracle_auc"]
    return manifest, as_metrics(metrics)


def _read(path: str) -> dict:
    import json

    with open(path) as fh:
        return json.load(fh)
