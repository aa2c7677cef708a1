"""A study preprocesses once: a trial that leaves the preprocessing keys alone trains on the
pipeline's dataset; one that changes them gets one copy per value of those keys, made once and
then reused."""

import json
from pathlib import Path

from recscale.pipelines.tune import nodes
from recscale.runconfig import DLRMConfig
from recscale.tune import apply
from tests.unit.test_tune_space import _params


def test_a_copy_per_value_of_the_preprocessing_keys_made_once(tmp_path, monkeypatch):
    base = apply(_params(), nodes.TRIAL_SETTINGS)
    made = []

    def fake_preprocess(raw, cfg: DLRMConfig):
        made.append(cfg.preprocess.output_dir)
        Path(cfg.preprocess.output_dir).mkdir(parents=True)
        (Path(cfg.preprocess.output_dir) / "_manifest.json").write_text(json.dumps({"splits": {}}))
        return ({"manifest_path": cfg.preprocess.output_dir},)

    monkeypatch.setattr(nodes, "preprocess", fake_preprocess)
    monkeypatch.setattr(nodes, "load_manifest",
                        lambda d: json.loads((d / "_manifest.json").read_text()))
    cache = nodes.DataCache({"raw": 1}, {"the": "pipeline's"}, base, str(tmp_path / "tune"))
    same = cache.params_for(apply(base, {"train.embedding_optimizer.learning_rate": 0.2}))
    assert cache.manifest_for(same, nodes._parse(same)) == {"the": "pipeline's"}
    # another output folder alone is the same data
    moved = cache.params_for(apply(base, {"preprocess.output_dir": "elsewhere"}))
    assert cache.manifest_for(moved, nodes._parse(moved)) == {"the": "pipeline's"}
    dims = [cache.params_for(apply(base, {"features.tables[items].dim": d})) for d in (8, 32, 8)]
    dirs = [p["preprocess"]["output_dir"] for p in dims]
    assert dirs[0] == dirs[2] != dirs[1] and all(d.startswith(str(tmp_path / "tune")) for d in dirs)
    for p in dims:
        cache.manifest_for(p, nodes._parse(p))
    assert made == [dirs[0], dirs[1]]  # the dim 8 copy was made once and read back after
