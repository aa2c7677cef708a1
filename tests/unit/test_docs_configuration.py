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
