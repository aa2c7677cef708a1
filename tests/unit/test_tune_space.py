"""The tuner's search space and ``tune`` block: each spec's form, keys set into the parameters
(list entries by name or position), and a bad key or bound named before any trial, against the
typed config (``DLRMConfig``)."""

import pytest
import yaml

from recscale.config import ConfigError, parse
from recscale.runconfig import DLRMConfig
from recscale.tune import DEFAULT_SPACE, TuneConfig, apply, check_space, parse_space, set_key
from tests.conftest import PROJECT_ROOT


def _params(env: str = "clicklog") -> dict:
    """conf/base merged with ``env``'s DLRM parameters, as a run resolves them."""
    from omegaconf import OmegaConf

    base = OmegaConf.load(PROJECT_ROOT / "conf/base/parameters_dlrm.yml")
    over = OmegaConf.load(PROJECT_ROOT / f"conf/{env}/parameters_dlrm.yml")
    return OmegaConf.to_container(OmegaConf.merge(base, over))


def _dlrm(params: dict) -> DLRMConfig:
    return parse(DLRMConfig, params, "")


def test_every_kind_of_spec_is_read_and_a_list_choice_is_drawn_by_index():
    space = parse_space({"a.lr": {"log_uniform": [1e-3, 1e-1]}, "a.p": {"uniform": [0, 1]},
                         "a.n": {"int": [1, 9, 2]}, "a.m": {"log_int": [1, 64]},
                         "model.top_mlp": {"choice": [[64, 1], [128, 64, 1]]}})
    assert [(p.key, p.kind) for p in space] == [
        ("a.lr", "log_uniform"), ("a.p", "uniform"), ("a.n", "int"), ("a.m", "log_int"),
        ("model.top_mlp", "choice")]

    class Trial:  # what Param.suggest asks of an Optuna trial
        def __init__(self):
            self.asked = {}

        def suggest_float(self, name, low, high, log=False):
            self.asked[name] = ("float", low, high, log)
            return low

        def suggest_int(self, name, low, high, step=1, log=False):
            self.asked[name] = ("int", low, high, step, log)
            return high

        def suggest_categorical(self, name, choices):
            self.asked[name] = ("cat", tuple(choices))
            return choices[-1]

    t = Trial()
    values = {p.key: p.suggest(t) for p in space}
    assert values == {"a.lr": 1e-3, "a.p": 0.0, "a.n": 9, "a.m": 64,
                      "model.top_mlp": [128, 64, 1]}
    assert t.asked["a.lr"] == ("float", 1e-3, 1e-1, True)
    assert t.asked["a.n"] == ("int", 1, 9, 2, False) and t.asked["a.m"] == ("int", 1, 64, 1, True)
    assert t.asked["model.top_mlp#"] == ("cat", (0, 1))  # lists are drawn by their position


def test_no_space_given_searches_the_default_one():
    assert [p.key for p in parse_space(None)] == list(DEFAULT_SPACE)
    assert [p.key for p in parse_space({})] == list(DEFAULT_SPACE)


@pytest.mark.parametrize("space, says", [
    ({"train.lr": {"log_unifrom": [0.1, 1]}},
     "tune.space['train.lr']: 'log_unifrom' is not a kind of range (did you mean 'log_uniform'?)"),
    ({"train.lr": {"log_uniform": [0, 1]}},
     "tune.space['train.lr'].log_uniform=[0, 1] is not allowed: expected 0 < low < high"),
    ({"train.lr": {"uniform": [1, 0.5]}}, "expected low < high"),
    ({"train.n": {"int": [1.5, 3]}}, "expected [low, high] or [low, high, step], integers"),
    ({"train.n": {"choice": []}}, "expected at least one value"),
    ({"train.lr": [0.1, 0.2]}, "tune.space['train.lr']=[0.1, 0.2] is not allowed: expected one of"),
    ({"data.generator.seed": {"int": [0, 3]}}, "keys under data.* cannot be searched"),
    ({"train..lr": {"uniform": [0, 1]}}, "'train..lr' is not a key"),
])
def test_a_bad_spec_is_named_with_what_is_allowed(space, says):
    with pytest.raises(ConfigError) as err:
        parse_space(space)
    assert says in str(err.value)


def test_keys_are_set_by_path_list_entries_by_name_or_position():
    params = _params()
    out = apply(params, {"features.tables[items].dim": 32, "model.top_mlp[0]": 256,
                         "train.embedding_optimizer.learning_rate": 0.05,
                         "model.dropout.dcn": 0.1})
    tables = {t["name"]: t for t in out["features"]["tables"]}
    assert tables["items"]["dim"] == 32 and tables["user_id"]["dim"] == 16
    assert out["model"]["top_mlp"] == [256, 64, 1]
    assert out["train"]["embedding_optimizer"]["learning_rate"] == 0.05
    assert params["model"]["top_mlp"] == [128, 64, 1]  # the parameters given are left alone
    cfg = _dlrm(out)
    assert {t.name: t.dim for t in cfg.schema.tables}["items"] == 32
    with pytest.raises(ConfigError, match=r"features.tables\[itms\].dim: no entry named 'itms' "
                                          r"\(did you mean 'items'\?\)"):
        set_key(params, "features.tables[itms].dim", 8)
    with pytest.raises(ConfigError, match=r"\[7\] is out of range: the list has 3 entries"):
        set_key(params, "model.top_mlp[7]", 8)


def test_a_misspelt_key_or_an_impossible_bound_stops_the_study_before_any_trial():
    params = _params()
    with pytest.raises(ConfigError) as err:
        check_space(parse_space({"train.embeding_optimizer.learning_rate":
                                 {"log_uniform": [0.01, 0.3]}}), params, _dlrm)
    msg = str(err.value)
    assert msg.startswith("tune.space['train.embeding_optimizer.learning_rate'] at 0.01:")
    assert "embeding_optimizer" in msg and "'embedding_optimizer'" in msg  # the nearest key
    with pytest.raises(ConfigError) as err:  # the upper bound is refused by the config itself
        check_space(parse_space({"model.dropout.top": {"uniform": [0.0, 1.5]}}), params, _dlrm)
    assert str(err.value).startswith("tune.space['model.dropout.top'] at 1.5: model.dropout.top=1.5")
    with pytest.raises(ConfigError, match=r"tune.space\['train.batch_size_per_rank'\] at 0"):
        check_space(parse_space({"train.batch_size_per_rank": {"int": [0, 4096]}}), params, _dlrm)
    # the shipped study's space is good
    shipped = yaml.safe_load((PROJECT_ROOT / "conf/clicklog/parameters_tune.yml").read_text())
    check_space(parse_space(shipped["tune"]["space"]), params, _dlrm)


@pytest.mark.parametrize("block, says", [
    ({"metric": "accuracy"}, "tune.metric='accuracy' is not allowed: expected one of 'auc', 'log_loss'"),
    ({"pruner": "hyperband"}, "tune.pruner='hyperband' is not allowed"),
    ({"trails": 5}, "trails"),
    ({"trials": 0}, "tune.trials=0 is not allowed: expected a positive integer"),
    ({"best_env": "base"}, "tune.best_env='base' is not allowed"),
    ({"storage": "study.db"}, "tune.storage='study.db' is not allowed: expected null"),
])
def test_a_bad_tune_block_is_named(block, says):
    with pytest.raises(ConfigError) as err:
        parse(TuneConfig, block, "tune")
    assert says in str(err.value)
    if "trails" in block:
        assert "'trials'" in str(err.value)  # the nearest known key


def test_the_shipped_tune_blocks_parse_and_name_their_storage_and_env():
    base = yaml.safe_load((PROJECT_ROOT / "conf/base/parameters_tune.yml").read_text())["tune"]
    cfg = parse(TuneConfig, base, "tune")
    assert cfg.storage_url(".") == "sqlite:///./data/07_model_output/tune/dlrm.db"
    assert cfg.env_name == "tuned_dlrm" and cfg.maximize
    assert not parse(TuneConfig, {"metric": "log_loss"}, "tune").maximize
