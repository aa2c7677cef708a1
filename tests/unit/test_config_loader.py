"""The project's config loader merges an env over base key by key, and lets an env give a mapping
where base has a list (preprocess.splits by time over base's fractions), which OmegaConf's merge
refuses."""

import yaml

from recscale.settings import CONFIG_LOADER_ARGS, CONFIG_LOADER_CLASS


def test_an_env_mapping_replaces_a_base_list_and_the_rest_merges_key_by_key(tmp_path):
    (tmp_path / "base").mkdir()
    (tmp_path / "ratings").mkdir()
    (tmp_path / "base" / "parameters.yml").write_text(yaml.safe_dump({
        "preprocess": {"splits": [0.8, 0.1, 0.1], "row_group_size": 65536},
        "features": "criteo", "model": {"top_mlp": [512, 1], "embedding_dim": 16}}))
    (tmp_path / "ratings" / "parameters.yml").write_text(yaml.safe_dump({
        "preprocess": {"splits": {"by": "ts", "fractions": [0.8, 0.1, 0.1]}},
        "features": {"label": "click"}, "model": {"top_mlp": {"oops": 1}}}))
    loader = CONFIG_LOADER_CLASS(str(tmp_path), env="ratings", **CONFIG_LOADER_ARGS)
    params = loader["parameters"]
    assert params["preprocess"] == {"splits": {"by": "ts", "fractions": [0.8, 0.1, 0.1]},
                                    "row_group_size": 65536}
    assert params["features"] == {"label": "click"}
    assert params["model"] == {"top_mlp": {"oops": 1}, "embedding_dim": 16}
    back = {"preprocess": {"splits": [0.9, 0.0, 0.1]}}  # and a list over a mapping
    (tmp_path / "ratings" / "parameters.yml").write_text(yaml.safe_dump(back))
    (tmp_path / "base" / "parameters.yml").write_text(yaml.safe_dump({
        "preprocess": {"splits": {"by": "ts", "fractions": [0.8, 0.1, 0.1]}}}))
    loader = CONFIG_LOADER_CLASS(str(tmp_path), env="ratings", **CONFIG_LOADER_ARGS)
    assert loader["parameters"] == back
