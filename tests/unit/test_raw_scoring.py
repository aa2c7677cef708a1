"""Scores from raw rows (``recscale.scoring.raw``) equal the evaluation path's on the same rows,
for a schema with every kind of feature; a changed fitted statistic or vocabulary entry breaks
the equality (training/serving skew is caught); rejected rows come back with their reason."""

import copy

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from recscale.config import ConfigError, parse
from recscale.data.preprocess import preprocess_table
from recscale.data.processed import PreprocessConfig, load_manifest
from recscale.data.schema import FittedSchema, parse_features, to_dict
from recscale.data.synthetic_table import TableSynthConfig, generate_table
from recscale.data.vocab import load_vocabulary
from recscale.evaluate.config import EvaluateConfig
from recscale.model.convert import recipe_from_resolved
from recscale.scoring import score_split
from recscale.scoring.files import score_files
from recscale.scoring.raw import RawScorer, frame_to_table
from tests.conftest import criteo_frame

SCHEMA = {"label": "click",
          "dense": [{"name": "price", "transforms": ["log1p", "standardize"]},
                    {"name": "dwell", "transforms": ["log1p", {"clip": [0, 3]}]},
                    {"name": "band", "column": "price", "transforms": [{"bucketize": [2, 8]}]}],
          "sparse": [{"name": "user", "id_type": "string"},
                     {"name": "item", "table": "items", "ids": "vocab"},
                     {"name": "history", "kind": "multi_hot", "table": "items", "ids": "vocab",
                      "max_len": 6, "truncate": "keep_last"},
                     {"name": "tags", "kind": "multi_hot", "pooling": "mean",
                      "weights": "tag_w", "max_len": 5, "truncate": "keep_first"}],
          "tables": [{"name": "user", "rows": 97, "dim": 8}, {"name": "items", "dim": 8},
                     {"name": "tags", "rows": 64, "dim": 8}, {"name": "band", "dim": 8}]}
MODEL = {"embedding_dim": 8, "bottom_mlp": [16, 8], "top_mlp": [16, 1], "interaction": "dot"}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("raw_scoring")
    schema = parse_features(SCHEMA)
    gen = parse(TableSynthConfig, {"num_rows": 3000, "seed": 5, "features": {
        "user": {"cardinality": 300}, "item": {"cardinality": 60},
        "history": {"cardinality": 60, "pooling": 3.0}, "tags": {"cardinality": 20,
                                                                 "pooling": 2.0},
        "price": {"missing": 0.1}}}, "data.generator")
    raw = generate_table(schema, gen, tmp / "raw.parquet").path
    cfg = PreprocessConfig(output_dir=str(tmp / "out"), row_group_size=512)
    man = load_manifest(preprocess_table([raw], tmp / "out", cfg, schema).manifest_path)
    resolved = {"model": MODEL, "schema": FittedSchema.of(man).to_dict(),
                "table_sizes": list(FittedSchema.of(man).table_rows),
                "train": {"seed": 11}, "preprocess": to_dict(cfg), "evaluate": {"batch_size": 700}}
    return raw, man, resolved


def _model_state(resolved, seed):
    torch.manual_seed(seed)
    model = recipe_from_resolved(resolved).build("cpu")
    with torch.no_grad():  # weights drawn at random, so every input moves the score
        for p in model.parameters():
            p.normal_(0, 0.3)
    return model, {k: v.clone() for k, v in model.state_dict().items()}


def _test_rows(raw, man):
    first = man["splits"]["train"]["rows"] + man["splits"]["validation"]["rows"]
    return first, pq.read_table(raw).slice(first)


def test_raw_rows_score_as_the_evaluation_path_scores_their_preprocessed_rows(dataset, seed):
    raw, man, resolved = dataset
    model, state = _model_state(resolved, seed)
    ref = score_split(model, man, "test", 512)
    scorer = RawScorer.load(resolved, state, man["vocabulary_path"])
    # the batch the run evaluated with, or the typed config's default where a config lacks it
    assert scorer.batch_size == resolved["evaluate"]["batch_size"]
    no_block = {k: v for k, v in resolved.items() if k != "evaluate"}
    assert RawScorer.load(no_block, state, man["vocabulary_path"]).batch_size \
        == EvaluateConfig.batch_size
    # the blocks go through their types: a key no type knows is named, not skipped
    bad = {**resolved, "evaluate": {**resolved["evaluate"], "batch_sise": 64}}
    with pytest.raises(ConfigError, match=r"unknown key evaluate.batch_sise \(did you mean "
                       "'batch_size'"):
        RawScorer.load(bad, state, man["vocabulary_path"])
    first, rows = _test_rows(raw, man)
    got = scorer.score_table(rows.drop_columns(["click"]))
    assert not got.errors and got.labels is None
    assert np.array_equal(first + np.arange(rows.num_rows), ref.rows)  # every row, by id
    assert np.abs(got.probs - ref.probs).max() <= 1e-6
    assert np.unique(np.round(ref.probs, 4)).size > 50  # the scores differ from row to row
    # the same through a pandas DataFrame of the raw values (what a served request becomes)
    with_labels = scorer.score_table(frame_to_table(rows.to_pandas()))
    assert np.abs(with_labels.probs - ref.probs).max() <= 1e-6
    assert np.array_equal(with_labels.labels, ref.labels.astype(np.int8))


@pytest.mark.parametrize("skew", ["statistic", "vocabulary"])
def test_a_changed_statistic_or_vocabulary_entry_breaks_the_equality(dataset, seed, skew,
                                                                      tmp_path):
    raw, man, resolved = dataset
    model, state = _model_state(resolved, seed)
    ref = score_split(model, man, "test", 512)
    resolved, vocab = copy.deepcopy(resolved), man["vocabulary_path"]
    if skew == "statistic":
        resolved["schema"]["stats"]["price"]["mean"] += 0.05
    else:  # the most frequent item's row given to the next one
        v = load_vocabulary(vocab, ("items",))
        v.ids[0][[0, 1]] = v.ids[0][[1, 0]]
        vocab = v.save(tmp_path / "vocabulary.parquet")
    got = RawScorer.load(resolved, state, vocab).score_table(_test_rows(raw, man)[1])
    assert np.abs(got.probs - ref.probs).max() > 1e-4


def test_rejected_rows_come_back_with_their_reason_and_the_others_are_scored(dataset, seed):
    raw, man, resolved = dataset
    _, state = _model_state(resolved, seed)
    scorer = RawScorer.load(resolved, state, man["vocabulary_path"])
    frame = pq.read_table(raw).slice(0, 6).to_pandas()
    frame = frame.astype({"price": object, "tag_w": object})
    frame.at[1, "price"] = "cheap"
    frame.at[3, "tag_w"] = [1.0] * (len(frame.at[3, "tags"]) + 1)
    frame.at[4, "click"] = 3
    got = scorer.score_table(frame_to_table(frame))
    assert set(got.errors) == {1, 3, 4}
    assert got.errors[1] == "bad dense value: price='cheap' is not a number"
    assert got.errors[3].startswith("bad weights: tags has")
    assert got.errors[4] == "bad label: click=3 is not 0 or 1"
    assert np.isnan(got.probs[[1, 3, 4]]).all() and np.isfinite(got.probs[[0, 2, 5]]).all()
    # the others score as the same rows alone do: bit for bit in a batch of the same rows (a
    # batch of other rows may differ in the last bits of fp32: the kernels block by batch size)
    kept = pq.read_table(raw).slice(0, 6).take([0, 2, 5])
    assert np.array_equal(got.probs[[0, 2, 5]], scorer.score_table(kept).probs)
    whole = scorer.score_table(pq.read_table(raw).slice(0, 6))
    assert np.abs(got.probs[[0, 2, 5]] - whole.probs[[0, 2, 5]]).max() <= 1e-6
    with pytest.raises(ConfigError, match="lack column.*user"):
        scorer.score_table(pq.read_table(raw).slice(0, 6).drop_columns(["user"]))


def test_an_empty_request_and_a_label_column_of_nan_are_answered_plainly(dataset, seed):
    raw, man, resolved = dataset
    _, state = _model_state(resolved, seed)
    scorer = RawScorer.load(resolved, state, man["vocabulary_path"])
    frame = pq.read_table(raw).slice(0, 8).to_pandas()
    # no rows, no scores (a frame without rows has columns of no type: nothing to parse)
    empty = scorer.score_table(frame_to_table(frame.iloc[0:0]))
    assert len(empty.probs) == 0 and empty.errors == {} and empty.labels is None
    with pytest.raises(ConfigError, match="lack column.*user"):
        scorer.score_table(frame_to_table(frame.iloc[0:0].drop(columns=["user"])))
    # a label column of NaN (a frame's way of saying "no label") scores as no label column
    unlabelled = scorer.score_table(frame_to_table(frame.drop(columns=["click"])))
    frame["click"] = np.nan
    got = scorer.score_table(frame_to_table(frame))
    assert got.errors == {} and got.labels is None
    assert np.array_equal(got.probs, unlabelled.probs)
    # columns the model does not read (a request id, a column of another model) are not read
    extra = frame.drop(columns=["click"]).assign(request_id=np.arange(8), user2=frame["user"])
    got = scorer.score_table(frame_to_table(extra))
    assert got.errors == {} and np.array_equal(got.probs, unlabelled.probs)
    # one missing label among labels is that row's reject, as in preprocessing
    frame["click"] = [0, 1, np.nan, 1, 0, 0, 1, 0]
    got = scorer.score_table(frame_to_table(frame))
    assert got.errors == {2: "bad label: click=missing is not 0 or 1"}


def test_batch_scoring_a_table_writes_every_row_in_order_with_the_evaluation_scores(
        dataset, seed, tmp_path):
    raw, man, resolved = dataset
    model, state = _model_state(resolved, seed)
    ref = score_split(model, man, "test", 512)
    scorer = RawScorer.load(resolved, state, man["vocabulary_path"], batch_size=333)
    seen = []
    rep = score_files(scorer, [raw], tmp_path / "scores.parquet", "table",
                      chunk_bytes=1 << 16, progress=lambda d, t: seen.append((d, t)))
    out = pq.read_table(rep.out_path)
    assert out.column("row").to_pylist() == list(range(3000))
    assert rep.rows_read == rep.rows_scored == 3000 and rep.labels and seen[-1] == (3000, 3000)
    score = out.column("score").to_numpy()
    assert np.abs(score[ref.rows] - ref.probs).max() <= 1e-6
    assert out.column("label").to_numpy()[ref.rows].tolist() == ref.labels.astype(int).tolist()
    # an empty file to score is named, not pyarrow's "Empty CSV file"
    (tmp_path / "empty.csv").write_text("")
    with pytest.raises(ConfigError, match=r"empty.csv: the file is empty \(0 bytes\)"):
        score_files(scorer, [tmp_path / "empty.csv"], tmp_path / "e.parquet", "table")
    assert 0.3 < rep.metrics["auc"] < 0.8  # weights at random: the metrics of what it scored


def _criteo(tmp_path, seed, ids="hash"):
    from recscale.data.preprocess import preprocess_criteo
    from recscale.data.synthetic import generate_criteo_tsv
    from tests.conftest import small_synthetic_config

    rep = generate_criteo_tsv(small_synthetic_config(num_rows=4000, seed=seed % 1000),
                              tmp_path / "day.tsv")
    lines = open(rep.path, "rb").read().splitlines(keepends=True)
    fields = lines[3500].split(b"\t")
    lines[3500] = b"\t".join([fields[0], b"x", *fields[2:]])  # a count that is not an integer
    lines[3700] = b"0\t1\t2\n"  # too few fields
    raw = tmp_path / "raw.tsv"
    raw.write_bytes(b"".join(lines))
    cfg = PreprocessConfig(output_dir=str(tmp_path / "out"), row_group_size=512,
                           max_table_size=300, ids=ids)
    man = load_manifest(preprocess_criteo([raw], tmp_path / "out", cfg).manifest_path)
    resolved = {"model": {"embedding_dim": 8, "bottom_mlp": [16, 8], "top_mlp": [16, 1]},
                "schema": FittedSchema.of(man).to_dict(), "train": {"seed": 1},
                "preprocess": to_dict(cfg)}
    return raw, man, resolved


@pytest.mark.parametrize("ids", ["vocab", "hash"])  # conf/base's ids, and conf/test's
def test_criteo_tsv_lines_and_criteo_rows_in_a_frame_score_as_the_evaluation_path(tmp_path,
                                                                                   seed, ids):
    raw, man, resolved = _criteo(tmp_path, seed, ids)
    model, state = _model_state(resolved, seed)
    ref = score_split(model, man, "test", 512)
    if ids == "vocab":  # the rows' ids went through a vocabulary, which serving must read
        assert pq.read_metadata(man["vocabulary_path"]).num_rows > 0
    scorer = RawScorer.load(resolved, state, man["vocabulary_path"] if ids == "vocab" else None)
    rep = score_files(scorer, [raw], tmp_path / "scores.parquet", "criteo_tsv",
                      chunk_bytes=1 << 14)
    out = pq.read_table(rep.out_path).to_pandas()
    assert out["row"].tolist() == list(range(4000)) and rep.rows_rejected == 2
    assert out.loc[3500, "error"] == "I1: not an integer: 'x'"
    assert out.loc[3700, "error"].startswith("field count: expected 40")
    assert np.abs(out["score"].to_numpy()[ref.rows] - ref.probs).max() <= 1e-6
    # the same lines as a DataFrame of raw values (counts as numbers, ids as hex strings)
    frame = criteo_frame([raw], ref.rows)
    got = scorer.score_table(frame_to_table(frame.drop(columns=["label"])))
    assert not got.errors
    assert np.abs(got.probs - ref.probs).max() <= 1e-6


def test_the_score_block_names_a_bad_key_and_a_pattern_matching_nothing(tmp_path):
    from recscale.scoring.config import ScoreConfig, ScoreData

    with pytest.raises(ConfigError, match=r"score.data.source='csv' is not allowed"):
        parse(ScoreConfig, {"data": {"source": "csv"}}, "score")
    with pytest.raises(ConfigError, match=r"score.serving.max_request_rows=0"):
        parse(ScoreConfig, {"serving": {"max_request_rows": 0}}, "score")
    with pytest.raises(ConfigError, match=r"score.model='champion'"):
        parse(ScoreConfig, {"model": "champion"}, "score")
    with pytest.raises(ConfigError, match=r"score.data.files\[1\]=.*matches no file"):
        ScoreData(files=(str(tmp_path), str(tmp_path / "day_*.tsv"))).expand()
    from recscale.data.source import DataConfig, prepare_raw  # the data block, the same way

    with pytest.raises(ConfigError, match=r"data.files\[0\]=.*day_\*.tsv' matches no file"):
        prepare_raw(DataConfig(source="criteo_tsv", files=(str(tmp_path / "day_*.tsv"),)))


def test_criteo_tsv_input_for_a_model_of_another_schema_is_refused(dataset, seed, tmp_path):
    raw, man, resolved = dataset
    _, state = _model_state(resolved, seed)
    scorer = RawScorer.load(resolved, state, man["vocabulary_path"])
    with pytest.raises(ConfigError, match="criteo_tsv.*another schema.*use source 'table'"):
        score_files(scorer, [raw], tmp_path / "s.parquet", "criteo_tsv")


TRICKY = {  # (column index, raw value) set on a good line: what Criteo's rules say of it
    "7 hex digits": (1 + 13 + 2, b"abcdef1"),
    "9 hex digits": (1 + 13 + 3, b"abcdef123"),
    "count +5 (legal)": (2, b"+5"),
    "count 1e3": (3, b"1e3"),
    "count 2.5": (4, b"2.5"),
    "count -0 (legal)": (5, b"-0"),
    "label 0.0": (0, b"0.0"),
    "label 1.0": (0, b"1.0"),
    "label 2": (0, b"2"),
    "empty label": (0, b""),
    "empty count (legal)": (6, b""),
    "empty id (legal)": (1 + 13 + 4, b""),
    "upper-case id (legal)": (1 + 13 + 5, b"ABCDEF12"),
    "non-ASCII id": (1 + 13 + 6, "é1234567".encode()),
    "id with a space": (1 + 13 + 7, b"abcd 123"),
}


def test_preprocessing_batch_scoring_and_the_served_model_accept_and_reject_the_same_criteo_lines(
        tmp_path, seed):
    """A file of tricky Criteo lines: preprocessing's rejects, the batch scorer of the TSV file
    and the served model given the lines as a frame (as text, and as a frame with numbers) reject
    the same rows with the same reasons and score the others alike."""
    import pandas as pd

    from recscale.data.criteo import COLUMN_NAMES
    from recscale.data.preprocess import preprocess_criteo

    raw, man, resolved = _criteo(tmp_path, seed)
    lines = open(raw, "rb").read().splitlines()[:200]
    lines = [ln for ln in lines if len(ln.split(b"\t")) == 40][:150]
    for k, (col, value) in enumerate(TRICKY.values()):
        fields = lines[10 + 7 * k].split(b"\t")
        fields[col] = value
        lines[10 + 7 * k] = b"\t".join(fields)
    tricky = tmp_path / "tricky.tsv"
    tricky.write_bytes(b"\n".join(lines) + b"\n")
    cfg = PreprocessConfig(output_dir=str(tmp_path / "t"), max_reject_fraction=1.0,
                           table_sizes=tuple(man["table_sizes"]))
    pre = preprocess_criteo([tricky], tmp_path / "t", cfg)
    rejected = pd.read_csv(pre.rejects_path, sep="\t", quoting=3, dtype=str)
    want = {int(r.line) - 1: r.reason for r in rejected.itertuples()}
    assert len(want) == 10  # the eleven-odd legal ones kept
    _, state = _model_state(resolved, seed)
    scorer = RawScorer.load(resolved, state)
    rep = score_files(scorer, [tricky], tmp_path / "s.parquet", "criteo_tsv")
    batch = pq.read_table(rep.out_path).to_pandas()
    assert {int(r): e for r, e in zip(batch["row"], batch["error"]) if isinstance(e, str)} == want
    # the served model: the lines as text, as a caller forwarding raw lines sends them
    text = pd.DataFrame([[f.decode("utf-8", "replace") for f in ln.split(b"\t")] for ln in lines],
                        columns=list(COLUMN_NAMES))
    got = scorer.score_table(frame_to_table(text))
    assert got.errors == want
    assert sum(e.startswith("bad byte") for e in want.values()) == 1  # the non-ASCII id
    ok = batch["error"].isna().to_numpy()
    assert np.abs(got.probs[ok] - batch["score"].to_numpy()[ok]).max() <= 1e-6
    # numbers as numbers (a count column with gaps is float): the same rows scored alike
    good = [r for r in range(len(lines)) if r not in want]
    frame = criteo_frame([tricky], good)
    got = scorer.score_table(frame_to_table(frame))
    assert not got.errors
    assert np.abs(got.probs - batch["score"].to_numpy()[good]).max() <= 1e-6
