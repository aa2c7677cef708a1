"""docs/configuration.md documents every key of the typed configs: each leaf of the DLRM root
(``DLRMConfig``), ``retrain``, ``score``, ``tune``, ``hf`` and ``hf_speech`` is named in the first cell of a
table row of its block's section (``## `block` ``, ``### `train.x` ``), or under a documented key
that stands for its subtree (a row ``train.launch.*``, or ``hf`` pointing at hf.optimizer's keys);
a key holding a mapping (``sharding.options``) by rows of its keys.
A row may name siblings after its first key: ``optimizer.damping_min``, ``damping_max``."""

import dataclasses
import re
import typing

from recscale.hf.config import MnistJobConfig, SpeechJobConfig
from recscale.retrain.config import RetrainConfig
from recscale.runconfig import DLRMConfig
from recscale.scoring.config import ScoreConfig
from recscale.tune import TuneConfig
from tests.conftest import PROJECT_ROOT

DOC = (PROJECT_ROOT / "docs" / "configuration.md").read_text()
ROOTS = ((DLRMConfig, ""), (RetrainConfig, "retrain."), (ScoreConfig, "score."),
         (TuneConfig, "tune."), (MnistJobConfig, "hf."), (SpeechJobConfig, "hf_speech."))


def sections() -> dict[str, set[str]]:
    """Each section's heading key -> the keys its tables' first cells name."""
    heads = list(re.finditer(r"^#{2,3} `([a-z_.]+)`(?: and `([a-z_.]+)`)?", DOC, re.M))
    out: dict[str, set[str]] = {}
    for i, m in enumerate(heads):
        body = DOC[m.start():heads[i + 1].start() if i + 1 < len(heads) else len(DOC)]
        keys = out.setdefault(m.group(1), set())
        for row in re.findall(r"^\| (.*?) \|", body, re.M):
            tokens = [t.replace("<column>", "*") for t in re.findall(r"`([^`]+)`", row)]
            if not tokens:
                continue
            parent = tokens[0].rsplit(".", 1)[0] + "." if "." in tokens[0] else ""
            keys.update(t if "." in t else parent + t for t in tokens[1:])
            keys.add(tokens[0])
        if m.group(2):
            out[m.group(2)] = keys
    return out


def leaves(cls, prefix: str):
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.init:
            t = hints[f.name]
            if dataclasses.is_dataclass(t):
                yield from leaves(t, f"{prefix}{f.name}.")
            else:
                yield prefix + f.name


def documented(key: str, secs: dict[str, set[str]]) -> bool:
    parts = key.split(".")
    if len(parts) == 1:
        return key in secs
    for n in range(len(parts) - 1, 0, -1):
        sec = ".".join(parts[:n])
        if sec not in secs:
            continue
        rel = parts[n:]
        names = secs[sec]
        # the key itself, a wildcard row over it, or a documented key above it (its subtree)
        return any(".".join(rel[:j]) in names or ".".join(rel[:j]) + ".*" in names
                   for j in range(1, len(rel) + 1)) \
            or any(k.endswith(".*") and ".".join(rel).startswith(k[:-1]) for k in names) \
            or any(k.startswith(".".join(rel) + ".") for k in names) \
            or ".".join(parts) in secs
    return False


def test_every_config_key_is_in_docs_configuration_md():
    secs = sections()
    missing = [k for cls, prefix in ROOTS for k in leaves(cls, prefix) if not documented(k, secs)]
    assert not missing, f"keys missing from docs/configuration.md: {missing}"


def test_the_check_finds_a_key_left_out():
    secs = sections()
    assert documented("train.checkpoint.init_grow", secs)
    secs["train.checkpoint"] = secs["train.checkpoint"] - {"init_grow"}
    assert not documented("train.checkpoint.init_grow", secs)
    assert not documented("train.no_such_key", secs) and not documented("nope", secs)


def _rows() -> list[tuple[str, list[str]]]:
    """(section key, cells) of every table row of a block's section."""
    heads = list(re.finditer(r"^#{2,3} `([a-z_.]+)`(?: and `([a-z_.]+)`)?", DOC, re.M))
    out = []
    for i, m in enumerate(heads):
        body = DOC[m.start():heads[i + 1].start() if i + 1 < len(heads) else len(DOC)]
        for row in re.findall(r"^\|(.*)\|\s*$", body, re.M):
            cells = [c.strip() for c in row.split(" | ")]
            if cells and cells[0].startswith("`"):
                out.append((m.group(0), cells))
    return out


def _split(cell: str) -> list[str]:
    """A defaults cell's values (siblings' defaults are comma-separated; lists keep theirs)."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(cell):
        depth += ch in "[{"
        depth -= ch in "]}"
        if ch == "," and depth == 0:
            items.append(cell[start:i].strip())
            start = i + 1
    return items + [cell[start:].strip()]


def _literal(text: str):
    """A documented default as a value; _PROSE where the cell says it in words."""
    import yaml

    text = text.replace("`", "").strip()
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return _PROSE
    if isinstance(value, str):
        if " " in value or value in ("same", "-"):  # words, or "as the other column"
            return _PROSE
        try:
            return float(value)  # 1e-6: a number YAML 1.1 reads as text
        except ValueError:
            return value
    return value


_PROSE = object()


def _same(doc, value) -> bool:
    if isinstance(value, (tuple, list)) and isinstance(doc, list):
        return len(doc) == len(value) and all(_same(a, b) for a, b in zip(doc, value))
    if isinstance(value, bool) or isinstance(doc, bool) or value is None or doc is None:
        return doc is value or doc == value
    if isinstance(value, (int, float)) and isinstance(doc, (int, float)):
        return abs(float(doc) - float(value)) <= 1e-12 * max(1.0, abs(float(value)))
    return str(doc) == str(value)


def _defaults() -> dict[str, object]:
    """Every typed key -> what a run gets without an env: conf/base's value, else the type's."""
    from recscale.settings import CONFIG_LOADER_ARGS, CONFIG_LOADER_CLASS

    base = CONFIG_LOADER_CLASS(str(PROJECT_ROOT / "conf"), env="local",
                               **CONFIG_LOADER_ARGS)["parameters"]
    out = {}

    def walk(cls, prefix, given):
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if not f.init:
                continue
            sub = given.get(f.name, dataclasses.MISSING) if isinstance(given, dict) \
                else dataclasses.MISSING
            if dataclasses.is_dataclass(hints[f.name]):
                walk(hints[f.name], f"{prefix}{f.name}.", sub if isinstance(sub, dict) else {})
                continue
            if sub is dataclasses.MISSING:
                sub = f.default if f.default is not dataclasses.MISSING else (
                    f.default_factory() if f.default_factory is not dataclasses.MISSING
                    else dataclasses.MISSING)
            out[prefix + f.name] = sub

    for cls, prefix in ROOTS:
        block = base if not prefix else base.get(prefix.rstrip("."), {})
        walk(cls, prefix, block)
    return out


def test_every_documented_default_is_what_a_run_gets():
    """A row's default (its cell, or one per sibling key) equals conf/base's value, else the
    type's default; the hf section's two columns are hf's and hf_speech's. Defaults said in
    words (a preset's list, "the name") are left to the reader."""
    defaults, checked, wrong = _defaults(), 0, []
    for head, cells in _rows():
        keys = re.findall(r"`([^`]+)`", cells[0].split("(")[0])
        section = re.findall(r"`([a-z_.]+)`", head)
        columns = [(section[0], cells[1])] if len(section) == 1 or len(cells) < 4 else \
            [(section[0], cells[1]), (section[1], cells[2])]
        for sec, cell in columns:
            docs = _split(cell) if len(keys) > 1 else [cell]
            if len(docs) != len(keys):
                continue
            for key, doc in zip(keys, docs):
                full = key if "." in key and key.split(".")[0] in (s.split(".")[0] for s in
                                                                      section) else \
                    f"{sec}.{key}" if sec else key
                if full not in defaults and f"{sec}.{key}" in defaults:
                    full = f"{sec}.{key}"
                value, got = defaults.get(full, _PROSE), _literal(doc)
                if value is _PROSE or got is _PROSE or value is dataclasses.MISSING:
                    continue
                checked += 1
                if not _same(got, value):
                    wrong.append(f"{full}: documented {doc!r}, a run gets {value!r}")
    assert not wrong, "\n".join(wrong)
    assert checked >= 200, checked
