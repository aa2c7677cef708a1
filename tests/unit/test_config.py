"""recscale.config: renamed keys name their new key, relative to the block or from the root."""

from dataclasses import dataclass, field
from typing import ClassVar

import pytest

from recscale.config import ConfigError, Validated, parse


@dataclass(frozen=True)
class Inner(Validated):
    world_size: int = 1


@dataclass(frozen=True)
class Block(Validated):
    RENAMED: ClassVar[dict[str, str]] = {
        "batch_size": "global_batch_size",  # same block
        "world_size": "launch.world_size",  # deeper in the same block
        "rows": "/data.max_rows",  # left the block: a full key from the root
    }

    global_batch_size: int = 8
    launch: Inner = field(default_factory=Inner)


@pytest.mark.parametrize("old,new", [
    ("batch_size", "hf.train.global_batch_size"),
    ("world_size", "hf.train.launch.world_size"),
    ("rows", "data.max_rows"),
])
def test_a_renamed_key_fails_naming_its_new_key(old, new):
    with pytest.raises(ConfigError, match=rf"^hf.train.{old} is not allowed: it is now {new}$"):
        parse(Block, {old: 2}, "hf.train")


def test_without_a_prefix_the_relative_name_stands_alone():
    with pytest.raises(ConfigError, match=r"^world_size is not allowed: it is now launch.world_size$"):
        parse(Block, {"world_size": 2})
    with pytest.raises(ConfigError, match=r"^rows is not allowed: it is now data.max_rows$"):
        parse(Block, {"rows": 2})


def test_the_new_keys_parse():
    b = parse(Block, {"global_batch_size": 4, "launch": {"world_size": 2}}, "hf.train")
    assert b.global_batch_size == 4 and b.launch.world_size == 2


def test_a_misspelt_key_names_the_nearest_known_one():
    with pytest.raises(ConfigError, match=r"unknown key hf\.train\.global_bach_size "
                                          r"\(did you mean 'global_batch_size'\?\)"):
        parse(Block, {"global_bach_size": 4}, "hf.train")
    # nothing near: no guess
    with pytest.raises(ConfigError, match=r"unknown key hf\.train\.zzz; allowed keys"):
        parse(Block, {"zzz": 4}, "hf.train")


def test_a_misspelt_parameter_block_stops_the_project_before_any_node():
    import yaml

    from recscale.hooks import PARAMETER_BLOCKS, RecscaleHooks
    from recscale.pipelines.common import DLRM_BLOCKS
    from tests.conftest import PROJECT_ROOT

    # the list is every block conf/base and the shipped envs write, the DLRM pipeline's first
    written = {k for f in (PROJECT_ROOT / "conf").glob("*/parameters*.yml")
               for k in (yaml.safe_load(f.read_text()) or {})}
    assert written == set(PARAMETER_BLOCKS)
    assert PARAMETER_BLOCKS[:len(DLRM_BLOCKS)] == DLRM_BLOCKS

    class Context:
        env = "mine"
        params = {"train": {"epochs": 1}, "trian": {"epochs": 2}, "model": {}}

    with pytest.raises(ConfigError, match=r"unknown parameter block 'trian' \(did you mean "
                                          r"'train'\?\) in the parameters of env 'mine'"):
        RecscaleHooks().after_context_created(Context())
    Context.params = {"train": {"epochs": 1}, "hf": {}}
    RecscaleHooks().after_context_created(Context())  # the known blocks pass
