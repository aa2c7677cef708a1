import numpy as np
import pytest

from recscale.data.criteo import (
    NUM_DENSE,
    NUM_SPARSE,
    RejectedRowsError,
    RejectLog,
    count_lines,
    encode_tsv,
    read_criteo_tsv,
)
from recscale.data.preprocess import PreprocessConfig, preprocess_criteo
from recscale.data.synthetic import BLOCK_ROWS, PlantedModel


def _concat(blocks):
    return {f: np.concatenate([getattr(b, f) for b in blocks])
            for f in ("line", "label", "dense", "dense_present", "sparse", "sparse_present")}


@pytest.mark.parametrize("chunk_bytes", [1 << 25, 50_000])
def test_reader_round_trips_generated_tsv_exactly(synthetic_tsv, chunk_bytes):
    cfg, rep = synthetic_tsv
    rejects = RejectLog(path=None)
    blocks = list(read_criteo_tsv(rep.path, rejects, chunk_bytes=chunk_bytes))
    got = _concat(blocks)
    assert rejects.count == 0
    assert np.array_equal(got["line"], np.arange(1, cfg.num_rows + 1))
    # the parsed values are exactly what the generator drew
    model = PlantedModel(cfg)
    expected = [model.block(b, min(BLOCK_ROWS, cfg.num_rows - b * BLOCK_ROWS))[0]
                for b in range(-(-cfg.num_rows // BLOCK_ROWS))]
    want = _concat(expected)
    for f in want:
        assert np.array_equal(got[f], want[f]), f
    # and encoding them again reproduces the file byte for byte
    data = b"".join(encode_tsv(b) for b in blocks)
    with open(rep.path, "rb") as fh:
        assert data == fh.read()


def test_a_reader_told_the_lines_it_needs_stops_at_the_first_chunk_past_them(synthetic_tsv):
    """The vocabulary's counting pass needs only the train split's lines: chunks that start at or
    after ``before_line`` are not parsed, and every line before it is read as in a full pass."""
    cfg, rep = synthetic_tsv
    full = list(read_criteo_tsv(rep.path, chunk_bytes=50_000))
    assert len(full) >= 4
    stop = int(np.random.default_rng(7).integers(2, full[len(full) // 2].line[-1]))
    part = list(read_criteo_tsv(rep.path, chunk_bytes=50_000, before_line=stop))
    assert part[0].line[0] == 1 and part[-1].line[0] < stop <= part[-1].line[-1] + 1
    assert len(part) < len(full)  # what follows was not read
    got, want = _concat(part), _concat(full[:len(part)])
    for f in want:
        assert np.array_equal(got[f], want[f]), f


def _good_line(rng):
    dense = [str(int(x)) if rng.random() > 0.2 else "" for x in rng.integers(-2, 1000, NUM_DENSE)]
    sparse = [f"{int(x):08x}" if rng.random() > 0.1 else "" for x in rng.integers(0, 2**32, NUM_SPARSE)]
    return "\t".join([str(int(rng.integers(0, 2)))] + dense + sparse)


def _write_dirty(tmp_path, n_good=400):
    rng = np.random.default_rng(7)
    lines = [_good_line(rng) for _ in range(n_good)]
    bad = {
        10: "\t".join(lines[10].split("\t")[:-1]),                    # wrong field count
        20: lines[20].rsplit("\t", 1)[0] + "\tzz12ab34",                # non-hex id
        30: "\t".join(["1", "12x"] + lines[30].split("\t")[2:]),        # non-integer dense
        40: "",                                                          # empty line
        50: "\t".join(["2"] + lines[50].split("\t")[1:]),               # label not 0/1
        60: lines[60].rsplit("\t", 1)[0] + "\tabc",                     # hex id too short
    }
    for i, text in bad.items():
        lines[i] = text
    path = tmp_path / "dirty.tsv"
    path.write_text("\n".join(lines) + "\n")
    return path, bad, lines


def test_malformed_rows_land_in_the_rejects_file_with_line_and_reason(tmp_path):
    path, bad, lines = _write_dirty(tmp_path)
    rejects = RejectLog(path=tmp_path / "rejects.tsv", total_lines=len(lines), max_fraction=0.05)
    got = _concat(list(read_criteo_tsv(path, rejects, chunk_bytes=4096)))
    rejects.close()
    good_lines = [i + 1 for i in range(len(lines)) if i not in bad]
    assert got["line"].tolist() == good_lines  # every other line kept, with its own line number
    rows = [r.split("\t") for r in (tmp_path / "rejects.tsv").read_text().splitlines()[1:]]
    by_line = {int(r[1]): r[2] for r in rows}
    assert sorted(by_line) == sorted(i + 1 for i in bad)
    assert by_line[11].startswith("field count: expected 40")
    assert by_line[21] == "C26: not an 8-digit hex id: 'zz12ab34'"
    assert by_line[31] == "I1: not an integer: '12x'"
    assert by_line[41] == "empty line"
    assert by_line[51].startswith("label: must be 0 or 1")
    assert by_line[61] == "C26: not an 8-digit hex id: 'abc'"
    assert rejects.count == len(bad)
    assert rejects.by_reason["field count"] == 1


@pytest.mark.parametrize("chunk_bytes", [1 << 20, 1024])
def test_dense_integers_follow_the_spark_rule_whatever_else_the_chunk_holds(tmp_path, chunk_bytes):
    """``^[+-]?[0-9]{1,18}$``, as the Spark engine: ``+5`` is 5, 19 digits are rejected with
    their reason, alone in a chunk (a plain cast would take them) or beside a bad value."""
    rng = np.random.default_rng(3)
    lines = [_good_line(rng).split("\t") for _ in range(6)]
    lines[1][1] = "+5"
    lines[2][1] = "1234567890123456789"  # fits int64 but has 19 digits
    lines[3][2] = "-000000000000000042"  # 18 digits: legal
    lines[5][1] = "12x"
    path = tmp_path / "ints.tsv"
    path.write_text("\n".join("\t".join(f) for f in lines) + "\n")
    rejects = RejectLog(path=tmp_path / "rejects.tsv", total_lines=6, max_fraction=0.5)
    got = _concat(list(read_criteo_tsv(path, rejects, chunk_bytes=chunk_bytes)))
    rejects.close()
    assert got["line"].tolist() == [1, 2, 4, 5]
    assert got["dense"][1, 0] == 5 and got["dense_present"][1, 0]
    assert got["dense"][2, 1] == -42
    rows = [r.split("\t") for r in (tmp_path / "rejects.tsv").read_text().splitlines()[1:]]
    assert {int(r[1]): r[2] for r in rows} == {3: "I1: not an integer: '1234567890123456789'",
                                               6: "I1: not an integer: '12x'"}


def test_line_without_final_newline_is_read(tmp_path):
    rng = np.random.default_rng(1)
    path = tmp_path / "t.tsv"
    path.write_text(_good_line(rng) + "\n" + _good_line(rng))
    assert count_lines(path) == 2
    got = _concat(list(read_criteo_tsv(path)))
    assert got["line"].tolist() == [1, 2]


def test_reject_threshold_stops_the_run_and_names_the_rejects_file(tmp_path):
    path, bad, lines = _write_dirty(tmp_path)  # 6 bad of 400 = 1.5 %
    with pytest.raises(RejectedRowsError, match=r"rejected \(more than max_reject_fraction=0.01\)"):
        preprocess_criteo([path], tmp_path / "out", PreprocessConfig(max_reject_fraction=0.01))
    assert (tmp_path / "out" / "rejects.tsv").exists()
    rep = preprocess_criteo([path], tmp_path / "ok", PreprocessConfig(max_reject_fraction=0.02))
    assert rep.rows_rejected == len(bad)
    assert rep.rows_written + rep.rows_rejected == rep.lines_read == len(lines)
