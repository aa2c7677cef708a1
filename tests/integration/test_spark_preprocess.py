"""The Spark engine writes what the pyarrow engine writes: same rows, rejects and vocabulary.

One local[2] SparkSession (tests/conftest.py: ``spark``) serves every test here; the input is
split into many small blocks so line numbering across blocks and files is exercised."""

import numpy as np
import pyarrow.parquet as pq
import pytest

from recscale.data.criteo import DENSE_NAMES, NUM_DENSE, NUM_SPARSE, SPARSE_NAMES, RejectedRowsError
from recscale.data.preprocess import SPLITS, PreprocessConfig, load_manifest, preprocess_criteo
from recscale.data.vocab import VocabConfig, load_vocabulary


def _good_fields(rng):
    dense = [str(int(x)) if rng.random() > 0.2 else "" for x in rng.integers(-3, 2000, NUM_DENSE)]
    # a few hundred distinct ids per feature with a skew, so min_count and max_size matter
    ids = (rng.zipf(1.6, NUM_SPARSE) * 2654435761) % (2**32)
    sparse = [f"{int(x):08x}" if rng.random() > 0.1 else "" for x in ids]
    return [str(int(rng.integers(0, 2)))] + dense + sparse


def _dirty_day(path, n, seed, final_newline=True):
    """``n`` lines; every kind of malformed line the reader rejects, plus legal oddities."""
    rng = np.random.default_rng(seed)
    lines = ["\t".join(_good_fields(rng)).encode() for _ in range(n)]

    def edit(i, j, value):
        f = lines[i].split(b"\t")
        f[j] = value
        lines[i] = b"\t".join(f)

    bad = {}
    for k, i in enumerate(range(7, n, 37)):
        kind = k % 16
        if kind == 0:
            lines[i] = b"\t".join(lines[i].split(b"\t")[:-1])          # 39 fields
        elif kind == 1:
            lines[i] = lines[i] + b"\textra"                           # 41 fields
        elif kind == 2:
            lines[i] = b""                                             # empty line
        elif kind == 3:
            edit(i, 1 + NUM_DENSE + 3, b"zz12ab34")                    # non-hex id
        elif kind == 4:
            edit(i, 2, b"12x")                                         # non-integer count
        elif kind == 5:
            edit(i, 0, b"2")                                           # label not 0/1
        elif kind == 6:
            edit(i, 0, b"")                                            # label missing
        elif kind == 7:
            edit(i, 1 + NUM_DENSE + 25, b"abc")                        # id too short
        elif kind == 8:
            lines[i] = lines[i] + b"\r"                                # CRLF line end
        elif kind == 9:
            edit(i, 5, b"\xff\xfe")                                    # not UTF-8
        elif kind == 10:
            edit(i, 5, "é".encode())                                   # non-ASCII
        elif kind == 11:
            edit(i, 3, b"it's")                                        # repr with "..."
        elif kind == 12:
            edit(i, 4, b"a\\'b\"")                                     # repr escapes
        elif kind == 13:
            edit(i, 1 + NUM_DENSE + 1, b"0123456789")                  # id too long
        elif kind == 14:
            edit(i, 1 + NUM_DENSE + 2, b"ABCDEF12")                    # upper case: legal
            edit(i, 6, b"-0")                                          # legal
            continue
        else:
            edit(i, 7, b"0042")                                        # leading zeros: legal
            continue
        bad[i] = kind
    for k, i in enumerate(range(11, n, 53)):  # dense integers at the edge of the rule
        if i in bad or (i - 7) % 37 == 0:
            continue
        if k % 2:
            edit(i, 8, b"+5")                                          # legal: 5
        else:
            edit(i, 2, b"1234567890123456789")                         # 19 digits
            bad[i] = 16
    data = b"\n".join(lines) + (b"\n" if final_newline else b"")
    path.write_bytes(data)
    return bad


@pytest.fixture(scope="module")
def dirty_days(tmp_path_factory):
    d = tmp_path_factory.mktemp("dirty")
    a, b = d / "day_00.tsv", d / "day_01.tsv"
    bad = len(_dirty_day(a, 1500, 1)) + len(_dirty_day(b, 900, 2, final_newline=False))
    return [str(a), str(b)], bad


def _cfg(**kw):
    base = dict(row_group_size=300, max_reject_fraction=0.2, table_sizes=None,
                max_table_size=97, workers=1, chunk_bytes=20_000)
    base.update(kw)
    return PreprocessConfig(**base)


def _both(spark, files, tmp_path, **kw):
    ref = preprocess_criteo(files, tmp_path / "pyarrow", _cfg(**kw))
    got = preprocess_criteo(files, tmp_path / "spark", _cfg(engine="spark", **kw), spark=spark)
    return ref, got


def _split_tables(man):
    return {s: pq.read_table(man["splits"][s]["files"]) for s in SPLITS}


def _assert_same_output(ref, got):
    mr, mg = load_manifest(ref.out_dir), load_manifest(got.out_dir)
    for k in ("lines_read", "rows_written", "rows_rejected", "table_sizes", "pooling_factors"):
        assert mg[k] == mr[k], k
    assert got.rejects_by_reason == ref.rejects_by_reason
    assert {s: mg["splits"][s]["rows"] for s in SPLITS} == {s: mr["splits"][s]["rows"] for s in SPLITS}
    tr, tg = _split_tables(mr), _split_tables(mg)
    for s in SPLITS:
        a, b = tr[s], tg[s]
        assert b.schema == a.schema, s
        for c in ("row", "label", *SPARSE_NAMES):
            assert b.column(c).to_pylist() == a.column(c).to_pylist(), (s, c)
        for c in DENSE_NAMES:  # log1p in the JVM and in numpy: equal within one float32 ulp
            x = a.column(c).to_numpy().view(np.int32).astype(np.int64)
            y = b.column(c).to_numpy().view(np.int32).astype(np.int64)
            assert np.abs(x - y).max(initial=0) <= 1, (s, c)
        for f in mg["splits"][s]["files"]:  # row groups of row_group_size, the last may be short
            md = pq.ParquetFile(f).metadata
            sizes = [md.row_group(i).num_rows for i in range(md.num_row_groups)]
            assert all(n == 300 for n in sizes[:-1]) and 0 < sizes[-1] <= 300
    # the same rejects file, line for line: file, line number, reason, text
    with open(ref.rejects_path, "rb") as fa, open(got.rejects_path, "rb") as fb:
        assert fb.read() == fa.read()


def test_spark_and_pyarrow_write_the_same_rows_and_rejects_in_hash_mode(spark, dirty_days, tmp_path):
    files, n_bad = dirty_days
    ref, got = _both(spark, files, tmp_path)
    assert ref.rows_rejected == n_bad and ref.lines_read == 2400
    assert set(ref.rejects_by_reason) == {"field count", "empty line", "bad byte", "label",
                                          "C4", "I2", "C26", "C2", "I3", "I4"}
    _assert_same_output(ref, got)
    assert got.table_sizes == (97,) * NUM_SPARSE


def test_spark_and_pyarrow_agree_in_vocab_mode(spark, dirty_days, tmp_path):
    files, _ = dirty_days
    ref, got = _both(spark, files, tmp_path, ids="vocab", vocab=VocabConfig(min_count=2, max_size=40))
    _assert_same_output(ref, got)
    va, vb = pq.read_table(ref.vocabulary_path), pq.read_table(got.vocabulary_path)
    assert vb.equals(va)
    assert max(ref.table_sizes) == 41 and min(ref.table_sizes) >= 1


def test_both_engines_stop_at_the_reject_threshold(spark, dirty_days, tmp_path):
    files, _ = dirty_days
    day = tmp_path / "short_day.tsv"  # the first 400 lines: 11 rejects (2.75 %)
    with open(files[0], "rb") as fh:
        day.write_bytes(b"".join(fh.readlines()[:400]))
    for engine in ("pyarrow", "spark"):
        with pytest.raises(RejectedRowsError, match=r"rejected \(more than max_reject_fraction=0.01\)"):
            preprocess_criteo([str(day)], tmp_path / engine,
                              _cfg(engine=engine, max_reject_fraction=0.01), spark=spark)
        assert (tmp_path / engine / "rejects.tsv").exists()


def test_vocabulary_grows_append_only_on_spark(spark, dirty_days, tmp_path):
    files, _ = dirty_days
    # the first day's vocabulary (either engine writes the same file: see the test above)
    first = preprocess_criteo(files[:1], tmp_path / "one", _cfg(ids="vocab",
                                                                  vocab=VocabConfig(min_count=3)))
    old = load_vocabulary(first.vocabulary_path, SPARSE_NAMES)
    grown_cfg = dict(ids="vocab", vocab=VocabConfig(min_count=3, path=first.vocabulary_path))
    ref, got = _both(spark, files[1:], tmp_path, **grown_cfg)
    _assert_same_output(ref, got)
    new = load_vocabulary(got.vocabulary_path, SPARSE_NAMES)
    for j in range(NUM_SPARSE):
        assert np.array_equal(new.ids[j][:len(old.ids[j])], old.ids[j])  # every old index kept
    assert sum(len(a) for a in new.ids) > sum(len(a) for a in old.ids)


@pytest.mark.parametrize("final_newline", [True, False])
def test_byte_blocks_hold_every_line_exactly_once(tmp_path, final_newline):
    from recscale.data.spark_preprocess import block_chunks

    lines = [b"a" * (i % 7) for i in range(200)]  # empty lines and lines of 1-6 bytes
    path = tmp_path / "f.tsv"
    path.write_bytes(b"\n".join(lines) + (b"\n" if final_newline else b""))
    size = path.stat().st_size
    want = b"".join(x + b"\n" for x in lines)
    for block in (1, 2, 3, 5, 8, 13, 64, size, size + 10):
        for chunk in (1, 4, 50, 1 << 20):
            got = [c for s in range(0, size, block)
                   for c in block_chunks(str(path), s, min(s + block, size), chunk)]
            assert all(c.endswith(b"\n") for c in got), (block, chunk)
            assert b"".join(got) == want, (block, chunk)


def test_a_table_of_your_own_preprocesses_the_same_on_spark(spark, tmp_path, seed):
    """Parquet row groups, a day partition and a text file with rejects, every feature kind
    (a history sharing the item table, weighted and averaged tags): worker processes and the
    Spark engine write the same rows, rejects, vocabulary and fitted schema as one process."""
    import csv

    import pyarrow as pa

    from recscale.data.preprocess import preprocess_table
    from recscale.data.schema import parse_features

    rng = np.random.default_rng(seed)

    def frame(n):
        return {"click": rng.integers(0, 2, n).tolist(),
                "price": [None if rng.random() < 0.1 else float(x)
                          for x in rng.lognormal(2, 1, n)],
                "user": [f"u{i}" for i in rng.integers(0, 60, n)],
                "item": rng.integers(0, 500, n).tolist(),
                "tags": [rng.integers(0, 40, rng.integers(0, 7)).tolist() for _ in range(n)],
                "hist": [rng.integers(0, 500, rng.integers(0, 9)).tolist() for _ in range(n)]}

    def weighted(d):
        d["tag_w"] = [np.round(rng.uniform(0.1, 3, len(t)), 3).tolist() for t in d["tags"]]
        return d

    for day in ("2026-01-01", "2026-01-02"):
        (tmp_path / f"day={day}").mkdir()
        t = pa.table(weighted(frame(900)), schema=pa.schema([
            ("click", pa.int64()), ("price", pa.float64()), ("user", pa.string()),
            ("item", pa.int64()), ("tags", pa.list_(pa.int64())),
            ("hist", pa.list_(pa.int64())), ("tag_w", pa.list_(pa.float64()))]))
        pq.write_table(t, tmp_path / f"day={day}" / "part.parquet", row_group_size=250)
    rows = weighted(frame(400))
    with open(tmp_path / "day=2026-01-03.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["click", "price", "user", "item", "tags", "hist", "tag_w", "day"])
        for i in range(400):
            tags = "|".join(map(str, rows["tags"][i]))
            tag_w = "|".join(map(str, rows["tag_w"][i] + ([1.5] if i % 61 == 5 else [])))
            price = "" if rows["price"][i] is None else rows["price"][i]
            if i % 53 == 7:
                price = "n/a"  # rejected: not a number
            w.writerow([rows["click"][i], price, rows["user"][i], rows["item"][i], tags,
                        "|".join(map(str, rows["hist"][i])), tag_w, "2026-01-03"])
    schema = parse_features({
        "label": "click",
        "dense": [{"name": "price", "transforms": ["log1p", "standardize"]},
                  {"name": "band", "column": "price", "transforms": [{"bucketize": [5, 20]}]}],
        "sparse": [{"name": "user", "id_type": "string", "ids": "vocab", "min_count": 3},
                   {"name": "item", "ids": "hash"}, {"name": "day", "id_type": "string"},
                   {"name": "tags", "kind": "multi_hot", "max_len": 4,
                    "truncate": "keep_last", "weights": "tag_w", "pooling": "mean"},
                   {"name": "hist", "kind": "multi_hot", "table": "item", "max_len": 6,
                    "truncate": "keep_last"}],
        "tables": [{"name": "item", "rows": 97}, {"name": "day", "rows": 8},
                   {"name": "tags", "rows": 50, "dim": 8}]})
    files = [tmp_path / "day=2026-01-01", tmp_path / "day=2026-01-02",
             tmp_path / "day=2026-01-03.csv"]
    got = {}
    for name, engine, workers in (("pyarrow", "pyarrow", 1), ("workers", "pyarrow", 2),
                                  ("spark", "spark", 1)):
        out = tmp_path / name
        cfg = PreprocessConfig(output_dir=str(out), engine=engine, row_group_size=300,
                               max_reject_fraction=0.05, workers=workers)
        rep = preprocess_table(files, out, cfg, schema, spark=spark)
        man = load_manifest(rep.manifest_path)
        tables = {s: pa.concat_tables([pq.read_table(f) for f in man["splits"][s]["files"]])
                  for s in SPLITS}
        with open(man["rejects_path"]) as fh:
            rejects = fh.read().splitlines()
        got[name] = (tables, man, rejects, pq.read_table(man["vocabulary_path"]))
    a, ma, ra, va = got["pyarrow"]
    # 8 prices that are not numbers, 7 rows with one weight more than their tags
    assert ma["rows_rejected"] == 15 and len(ra) == 16
    assert sum("bad weights: tags has" in line for line in ra) == 7
    assert "tags.weights" in a["train"].column_names
    for other in ("workers", "spark"):  # worker processes and Spark tasks: one part per unit
        b, mb, rb, vb = got[other]
        assert mb["rows_rejected"] == 15
        assert ra == [line.replace(str(tmp_path / other), str(tmp_path / "pyarrow"))
                      for line in rb]
        for s in SPLITS:
            assert a[s].equals(b[s]), (other, s)
        assert len(mb["splits"]["train"]["files"]) > 1
        assert ma["schema"] == mb["schema"] and ma["table_sizes"] == mb["table_sizes"]
        assert ma["pooling_factors"] == mb["pooling_factors"]
        assert va.equals(vb)
    assert got["spark"][1]["engine"] == "spark" and ma["engine"] == "pyarrow"


def test_the_retrain_prepares_its_night_on_spark_as_on_pyarrow(spark, tmp_path):
    """``dlrm_retrain`` with ``preprocess.engine: spark``: night 2's partitions, grown onto
    night 1's vocabulary, give the same splits, tables and vocabulary as with pyarrow."""
    from recscale.config import parse
    from recscale.data.synthetic import generate_criteo_tsv
    from recscale.retrain import DLRMRetrainConfig, WarmStart, find_partitions, prepare_partitions
    from tests.conftest import small_synthetic_config

    landing = tmp_path / "daily"
    for day in (0, 1):
        generate_criteo_tsv(small_synthetic_config(num_rows=1200), landing / f"day_{day:02d}.tsv",
                            day=day)
    parts = find_partitions(landing, "day_*.tsv")
    out = {}
    for engine in ("pyarrow", "spark"):
        cfg = parse(DLRMRetrainConfig, {
            "preprocess": {"ids": "vocab", "engine": engine, "row_group_size": 300},
            "retrain": {"work_dir": str(tmp_path / engine / "work"),
                        "model_dir": str(tmp_path / engine / "models")}}, "")
        night1 = prepare_partitions(parts[:1], WarmStart("cold"), cfg)
        warm = WarmStart("latest", None, {"table_sizes": night1["table_sizes"]}, "night 1")
        out[engine] = prepare_partitions(parts[1:], warm, cfg)
    ref, got = out["pyarrow"], out["spark"]
    assert got["engine"] == "spark" and got["table_sizes"] == ref["table_sizes"]
    assert all(b >= a for a, b in zip(night1["table_sizes"], got["table_sizes"]))
    assert pq.read_table(got["vocabulary_path"]).equals(pq.read_table(ref["vocabulary_path"]))
    for s in SPLITS:
        assert got["splits"][s]["rows"] == ref["splits"][s]["rows"]
        a, b = (pq.read_table(m["splits"][s]["files"]) for m in (ref, got))
        assert b.select(["row", "label", *SPARSE_NAMES]).equals(
            a.select(["row", "label", *SPARSE_NAMES])), s
