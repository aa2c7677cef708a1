"""features.label: {column, positive}: which values of a column are clicks (recscale.data.label),
in preprocessing (parquet and text, both read by one parser), in the fitted schema and in the
generator; a column of ratings without a rule stops before any work, saying what to write."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recscale.config import ConfigError
from recscale.data.preprocess import preprocess_table
from recscale.data.processed import PreprocessConfig, load_manifest
from recscale.data.schema import FittedSchema, parse_features, schema_change
from recscale.data.synthetic_table import TableSynthConfig, generate_table


@pytest.fixture
def rng(seed):
    return np.random.default_rng(seed)


def cfg(out: Path, **kw) -> PreprocessConfig:
    return PreprocessConfig(output_dir=str(out), max_table_size=1000, row_group_size=97, **kw)


def labels_by_row(manifest: dict) -> dict[int, int]:
    out = {}
    for s in ("train", "validation", "test"):
        for f in manifest["splits"][s]["files"]:
            t = pq.read_table(f, columns=["row", "label"])
            out.update(zip(t.column("row").to_pylist(), t.column("label").to_pylist()))
    return out


def rejects(manifest: dict) -> list[str]:
    """The rejected rows' reasons, in row order."""
    with open(manifest["rejects_path"]) as fh:
        return [r["reason"] for r in csv.DictReader(fh, delimiter="\t")]


def schema_with(label) -> object:
    return parse_features({"label": label, "dense": [{"name": "price"}],
                           "sparse": [{"name": "item"}]})


def run(tmp_path, name, table: pa.Table, label, text: bool = False, **kw) -> dict:
    src = tmp_path / f"{name}.{'csv' if text else 'parquet'}"
    if text:
        with open(src, "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(table.column_names)
            w.writerows(zip(*(["" if v is None else v for v in c.to_pylist()]
                              for c in table.columns)))
    else:
        pq.write_table(table, src)
    out = tmp_path / name
    rep = preprocess_table([src], out, cfg(out, max_reject_fraction=0.2, **kw), schema_with(label))
    return load_manifest(rep.manifest_path)


@pytest.mark.parametrize("text", [False, True], ids=["parquet", "csv"])
def test_a_comparison_rule_reads_ratings_as_clicks_and_rejects_missing_or_non_numbers(
        tmp_path, rng, text):
    n = 300
    rating = rng.integers(1, 6, n).astype(object)
    rating[7], rating[11] = None, "abc" if text else None
    if not text:
        rating = rating.astype(float)
        rating[11] = np.nan
    col = [None if v is None else str(v) for v in rating.tolist()] if text else rating.tolist()
    t = pa.table({"rating": pa.array(col, from_pandas=True),
                  "price": rng.uniform(0, 9, n), "item": rng.integers(0, 50, n)})
    m = run(tmp_path, "r", t, {"column": "rating", "positive": ">= 4"}, text=text)
    got = labels_by_row(m)
    want = {i: int(float(r) >= 4) for i, r in enumerate(rating.tolist())
            if r is not None and r == r and r != "abc"}
    assert got == want
    assert rejects(m) == ["bad label: rating=missing",
                          "bad label: rating='abc' is not a number" if text
                          else "bad label: rating=missing"]


@pytest.mark.parametrize("op,ref", [("> 3", lambda x: x > 3), ("< 2.5", lambda x: x < 2.5),
                                    ("<= 2", lambda x: x <= 2), ("== 5", lambda x: x == 5),
                                    ("!= 1", lambda x: x != 1)])
def test_every_comparison_matches_python(tmp_path, rng, op, ref):
    x = rng.integers(0, 7, 120).astype(float)
    t = pa.table({"score": x, "price": rng.uniform(0, 9, 120), "item": rng.integers(0, 9, 120)})
    m = run(tmp_path, "c", t, {"column": "score", "positive": op})
    assert labels_by_row(m) == {i: int(ref(v)) for i, v in enumerate(x)}


def test_a_set_of_event_types_and_a_boolean_column(tmp_path, rng):
    n = 200
    events = rng.choice(["view", "cart", "buy", " buy "], n).tolist()
    events[3] = ""
    t = pa.table({"event": events, "price": rng.uniform(0, 9, n), "item": rng.integers(0, 9, n)})
    m = run(tmp_path, "e", t, {"column": "event", "positive": ["buy", "cart"]})
    assert labels_by_row(m) == {i: int(e.strip() in ("buy", "cart"))
                                for i, e in enumerate(events) if i != 3}
    assert rejects(m) == ["bad label: event=missing"]
    flags = rng.random(n) < 0.3
    t = pa.table({"bought": flags, "price": rng.uniform(0, 9, n), "item": rng.integers(0, 9, n)})
    want = {i: int(f) for i, f in enumerate(flags)}
    for text in (False, True):  # parquet booleans; text "True"/"False" as Python writes them
        m = run(tmp_path, f"b{text}", t, {"column": "bought", "positive": True}, text=text)
        assert labels_by_row(m) == want
    # without a rule a boolean column is a 0/1 label already
    m = run(tmp_path, "plain", t, "bought")
    assert labels_by_row(m) == want


def test_ratings_without_a_rule_stop_before_any_work_naming_the_rule_to_write(tmp_path, rng):
    n = 100
    t = pa.table({"rating": rng.integers(1, 6, n), "price": rng.uniform(0, 9, n),
                  "item": rng.integers(0, 9, n)})
    with pytest.raises(ConfigError) as e:
        run(tmp_path, "x", t, "rating")
    msg = str(e.value)
    assert msg.startswith("features.label: column 'rating' is not a 0/1 click (values seen: ")
    assert 'features.label: {column: rating, positive: ">= 4"}' in msg
    seen = msg.split("values seen: ")[1].split(")")[0].split(", ")
    assert 2 <= len(seen) <= 5 and all(float(v) in (2, 3, 4, 5) for v in seen)
    assert not (tmp_path / "x" / "_manifest.json").exists()
    # a few stray values in a 0/1 column stay rejected rows, as before
    y = rng.integers(0, 2, n)
    y[[4, 9]] = 7
    t = t.set_column(0, "rating", pa.array(y))
    m = run(tmp_path, "y", t, "rating")
    assert rejects(m) == ["bad label: rating=7 is not 0 or 1"] * 2


@pytest.mark.parametrize("positive,needs", [(">= four", "a comparison with a number"),
                                            ([], "a list of values"), ("", "one value"),
                                            ({"a": 1}, "a comparison")])
def test_a_bad_rule_names_its_key(positive, needs):
    with pytest.raises(ConfigError, match=rf"features\.label\.positive=.* expected .*{needs}"):
        schema_with({"column": "rating", "positive": positive})
    with pytest.raises(ConfigError, match=r"unknown key features\.label\.postive .*'positive'"):
        schema_with({"column": "rating", "postive": ">= 4"})


def test_the_rule_travels_in_the_fitted_schema_and_a_changed_rule_is_a_schema_change():
    a = schema_with({"column": "rating", "positive": ">= 4"})
    fitted = FittedSchema.fit(a, [9])
    back = FittedSchema.of({"schema": fitted.to_dict()})
    assert back.schema == a and back.schema.label_column == "rating"
    b = schema_with({"column": "rating", "positive": ">= 3"})
    assert schema_change(a, b) == ("the label is {'column': 'rating', 'positive': '>= 3'}, the "
                                   "model's is {'column': 'rating', 'positive': '>= 4'}")
    assert schema_change(a, a) is None


@pytest.mark.parametrize("positive", [">= 4", "< 0.5", ["buy", "cart"], [4, 5], True])
def test_the_generator_writes_values_its_rule_reads_as_its_clicks(tmp_path, positive):
    schema = schema_with({"column": "y", "positive": positive})
    rep = generate_table(schema, TableSynthConfig(num_rows=3000, seed=1), tmp_path / "g.parquet")
    m = load_manifest(preprocess_table([tmp_path / "g.parquet"], tmp_path / "o",
                                       cfg(tmp_path / "o"), schema).manifest_path)
    got = labels_by_row(m)
    assert len(got) == 3000 and not rejects(m)
    assert abs(np.mean(list(got.values())) - rep.ctr) < 1e-12
