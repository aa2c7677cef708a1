"""Checkpoints in one process: exact resume, damaged checkpoints, a failed write, the NaN guard."""

import errno
import logging
import os
import re
from pathlib import Path

import pytest
import torch

from recscale.config import ConfigError, parse
from recscale.model import ModelConfig
from recscale.runconfig import TrainConfig
from recscale.train import NonFiniteLossError, train_dlrm
from recscale.train.checkpoint import list_checkpoints, read_manifest, verify_files

SMALL = {"embedding_dim": 16, "bottom_mlp": [32, 16], "top_mlp": [32, 1]}


def _train(manifest, ckpt_dir, **train):
    tcfg = parse(TrainConfig, {"batch_size_per_rank": 1500, "progress": "off", "log_every": 5,
                               "embedding_optimizer": {"name": "exact_rowwise_adagrad"},
                               "checkpoint": {"dir": str(ckpt_dir), "every_steps": 4,
                                              "keep_last": 3},
                               **train}, "train")
    return train_dlrm(manifest, parse(ModelConfig, SMALL, "model"), tcfg)


def _same(a, b):
    sa, sb = a.model.state_dict(), b.model.state_dict()
    assert sa.keys() == sb.keys()
    bad = [k for k in sa if not torch.equal(sa[k], sb[k])]
    assert not bad, f"differ: {bad}"


@pytest.fixture(scope="module")
def clean_run(parquet_dataset, tmp_path_factory):
    return _train(parquet_dataset, tmp_path_factory.mktemp("clean"), max_steps=10)


def test_a_stopped_run_resumed_from_its_checkpoint_ends_bitwise_equal(parquet_dataset, clean_run,
                                                                       tmp_path):
    first = _train(parquet_dataset, tmp_path, max_steps=6)
    assert [Path(p).name for p in first.result.checkpoints] == ["step-00000004", "step-00000006"]
    resumed = _train(parquet_dataset, tmp_path, max_steps=10, checkpoint={
        "dir": str(tmp_path), "every_steps": 4, "resume": "latest"})
    assert resumed.result.extra["resumed"] == 1.0
    assert resumed.result.steps == 10 and resumed.result.samples == clean_run.result.samples
    _same(resumed, clean_run)


def test_a_damaged_checkpoint_is_refused_by_name_and_the_previous_one_used(
        parquet_dataset, clean_run, tmp_path, caplog):
    _train(parquet_dataset, tmp_path, max_steps=6)
    newest = list_checkpoints(str(tmp_path), all_runs=True)[0]
    shard = next(p for p in sorted(os.listdir(newest)) if p.endswith(".distcp"))
    with open(os.path.join(newest, shard), "r+b") as fh:  # flip one byte in the middle
        fh.seek(os.path.getsize(os.path.join(newest, shard)) // 2)
        byte = fh.read(1)
        fh.seek(-1, os.SEEK_CUR)
        fh.write(bytes([byte[0] ^ 0xFF]))
    with caplog.at_level(logging.WARNING):
        resumed = _train(parquet_dataset, tmp_path, max_steps=10, checkpoint={
            "dir": str(tmp_path), "resume": "latest"})
    assert re.search(rf"refused: checkpoint .*step-00000006: shard file {shard} fails its SHA-256",
                     caplog.text)
    assert "resumed from the previous checkpoint" in caplog.text and "step-00000004" in caplog.text
    _same(resumed, clean_run)  # resumed from step 4: still the same model


def test_a_missing_shard_file_is_refused_naming_it(parquet_dataset, tmp_path):
    _train(parquet_dataset, tmp_path, max_steps=4)
    ckpt = list_checkpoints(str(tmp_path), all_runs=True)[0]
    manifest = read_manifest(ckpt)
    name = next(n for n in manifest["files"] if n.endswith(".distcp"))
    os.remove(os.path.join(ckpt, name))
    from recscale.train.checkpoint import CheckpointRefused
    with pytest.raises(CheckpointRefused, match=f"shard file {re.escape(name)} is missing"):
        verify_files(ckpt, manifest)
    # resuming explicitly from it fails loudly rather than starting over
    with pytest.raises(RuntimeError, match="no usable checkpoint.*is missing"):
        _train(parquet_dataset, tmp_path, max_steps=6, checkpoint={"dir": str(tmp_path),
                                                                   "resume": ckpt})


def test_a_write_that_fails_half_way_leaves_the_previous_checkpoint_intact(
        parquet_dataset, tmp_path, monkeypatch, caplog):
    import torch.distributed.checkpoint.filesystem as fs

    real = fs._write_item
    written = []

    def disk_full_in_step_8(transforms, stream, *args, **kwargs):
        name = str(getattr(stream, "name", ""))
        if "step-00000008" in name:
            written.append(name)
            if len(written) % 3 == 0:  # two items of step 8 reach the disk; the third does not
                raise OSError(errno.ENOSPC, "No space left on device")
        return real(transforms, stream, *args, **kwargs)

    monkeypatch.setattr(fs, "_write_item", disk_full_in_step_8)
    with caplog.at_level(logging.ERROR):
        run = _train(parquet_dataset, tmp_path / "full", max_steps=8)
    assert "checkpoint of step 8 was NOT written" in caplog.text and "No space left" in caplog.text
    # step 8 is both a due checkpoint and the end of training: both attempts failed
    assert run.result.extra["checkpoint_failures"] == 2.0
    run_dir = next((tmp_path / "full").iterdir())
    assert sorted(os.listdir(run_dir)) == ["step-00000004"]  # no half-written step-8 anywhere
    ckpt = str(run_dir / "step-00000004")
    verify_files(ckpt, read_manifest(ckpt))


def test_nan_loss_stops_with_step_and_batch_keeping_the_last_good_checkpoint(parquet_dataset,
                                                                             tmp_path):
    with pytest.raises(NonFiniteLossError,
                       match=r"loss is nan at step 6: batch 5 of epoch 1, rows \d+\.\.\d+"):
        _train(parquet_dataset, tmp_path, max_steps=10,
               fault_injection={"rank": 0, "step": 6, "kind": "nan"})
    ckpts = list_checkpoints(str(tmp_path), all_runs=True)
    assert [Path(p).name for p in ckpts] == ["step-00000004"]
    verify_files(ckpts[0], read_manifest(ckpts[0]))


def test_bad_checkpoint_settings_name_the_key():
    with pytest.raises(ConfigError, match=r"train\.checkpoint\.keep_last"):
        parse(TrainConfig, {"checkpoint": {"dir": "x", "keep_last": 0}}, "train")
    with pytest.raises(ConfigError, match=r"train\.checkpoint\.resume"):
        parse(TrainConfig, {"checkpoint": {"dir": "x", "resume": "sometimes"}}, "train")
    with pytest.raises(ConfigError, match=r"train\.fault_injection\.kind"):
        parse(TrainConfig, {"fault_injection": {"kind": "flood"}}, "train")
    with pytest.raises(ConfigError, match=r"train\.fault_injection\.rank"):
        parse(TrainConfig, {"launch": {"world_size": 2}, "fault_injection": {"rank": 2}}, "train")


def test_every_torch_load_in_the_project_is_weights_only():
    root = Path(__file__).resolve().parents[2]
    offenders = []
    for path in list((root / "src").rglob("*.py")) + list((root / "benchmarks").rglob("*.py")):
        text = path.read_text()
        for m in re.finditer(r"torch\.load\(", text):
            call = text[m.start(): text.find(")", m.start() + 200) + 1]
            if "weights_only=True" not in call:
                offenders.append(f"{path.relative_to(root)}: {call[:80]}")
    assert not offenders, offenders


def test_tables_on_the_ssd_tier_checkpoint_and_resume_bitwise(parquet_dataset, tmp_path):
    """Checkpoints capture every tier: tables the plan puts on SSD (behind a cache) are flushed
    into the checkpoint, restored through their views, and the resumed run ends equal to an
    uninterrupted all-in-memory run."""
    from recscale.runconfig import DLRMConfig, plan_for_run

    tiers = {"ram_budget_bytes": 2_000_000, "scratch_dir": str(tmp_path / "scratch"),
             "min_cache_rows": 256}
    train_d = {"batch_size_per_rank": 256, "progress": "off", "seed": 2, "max_steps": 8,
               "checkpoint": {"dir": str(tmp_path / "ck"), "every_steps": 3}}
    model_d = {"embedding_dim": 16, "bottom_mlp": [32, 16], "top_mlp": [32, 1]}
    plan = plan_for_run(parquet_dataset, parse(DLRMConfig, {
        "sharding": {"topology": "cpu-local"}, "model": model_d,
        "train": {**train_d, "tiers": tiers}}, "")).to_dict()
    assert any(t["shards"][0]["tier"] == "ssd" for t in plan["tables"])
    model_cfg = parse(ModelConfig, model_d, "model")

    def run(**over):
        return train_dlrm(parquet_dataset, model_cfg, parse(TrainConfig, {**train_d, **over}, "train"),
                          plan if "tiers" in over else None)

    memory = run(checkpoint={"dir": None})
    first = run(tiers=tiers, max_steps=5)  # checkpoints at steps 3 and 5, tables on SSD
    assert first.result.extra["tiers.bytes_read.ssd"] > 0
    resumed = run(tiers=tiers, checkpoint={"dir": str(tmp_path / "ck"), "resume": "latest"})
    assert resumed.result.extra["resumed"] == 1.0
    _same(resumed, memory)


def test_partial_checkpoints_are_never_resumed_from(parquet_dataset, clean_run, tmp_path):
    """A crash mid-write leaves step-N.tmp (no manifest): it is not a checkpoint; nor is a step
    directory without a manifest. Resume takes the newest complete one."""
    _train(parquet_dataset, tmp_path, max_steps=6)
    run_dir = next(p for p in tmp_path.iterdir() if p.is_dir())
    (run_dir / "step-00000009.tmp").mkdir()
    (run_dir / "step-00000009.tmp" / "__0_0.distcp").write_bytes(b"half")
    (run_dir / "step-00000010").mkdir()  # a copy that lost its manifest
    assert [Path(p).name for p in list_checkpoints(str(tmp_path), all_runs=True)][0] == "step-00000006"
    resumed = _train(parquet_dataset, tmp_path, max_steps=10, checkpoint={
        "dir": str(tmp_path), "resume": "latest"})
    _same(resumed, clean_run)


def test_init_from_starts_with_the_checkpoints_model_and_optimizer_state_counters_at_zero(
        parquet_dataset, tmp_path):
    """train.checkpoint.init_from (the retrain's warm start): weights, row-wise Adagrad state and
    the dense optimizer come from the checkpoint; steps, samples and the data position do not."""
    source = _train(parquet_dataset, tmp_path / "src", max_steps=6)
    ckpt = source.result.checkpoints[-1]
    warm = _train(parquet_dataset, tmp_path / "warm", max_steps=4,
                  checkpoint={"dir": str(tmp_path / "warm"), "init_from": ckpt})
    cold = _train(parquet_dataset, tmp_path / "cold", max_steps=4)
    assert warm.result.extra["initialised_from_checkpoint"] == 1.0
    assert warm.result.steps == 4 and warm.result.samples == cold.result.samples  # from row 0
    src_state = source.model.embeddings.split_optimizer_states()
    warm_state = warm.model.embeddings.split_optimizer_states()
    cold_state = cold.model.embeddings.split_optimizer_states()
    # row-wise Adagrad's state only grows: warm >= the source's everywhere, and it carries rows
    # that only the source's 6 steps touched, which the cold run's 4 steps did not
    for (s,), (w,) in zip(src_state, warm_state):
        assert torch.all(w >= s)
    assert any(torch.any((s > 0) & (c == 0)) for (s,), (c,) in zip(src_state, cold_state))
    sd_w, sd_c = warm.model.state_dict(), cold.model.state_dict()
    assert any(not torch.equal(sd_w[k], sd_c[k]) for k in sd_w)


def test_the_cuda_rng_state_is_saved_and_restored(tmp_path, monkeypatch):
    """A checkpoint restores the CUDA generator as well as the CPU one. Without a GPU a fake CUDA
    generator stands in (torch.cuda.is_available / get_rng_state / set_rng_state); with one, the
    real generator is used."""
    from torch import nn

    from recscale.runconfig import CheckpointConfig
    from recscale.train import checkpoint_files
    from recscale.train.checkpoint import Checkpointer, dense_tensors

    fake = not torch.cuda.is_available()
    if fake:
        class FakeCudaRng:
            state = torch.randint(0, 256, (16,), dtype=torch.uint8)

            def available(self):
                return True

            def get(self):
                return self.state.clone()

            def set(self, new):
                self.state = new.clone()

        monkeypatch.setattr(checkpoint_files, "CUDA_RNG", FakeCudaRng())
    rng = checkpoint_files.CUDA_RNG
    dense = nn.Linear(3, 2)
    ckpt = Checkpointer(CheckpointConfig(dir=str(tmp_path)), "run")
    saved = rng.get().clone()
    tensors, rest = dense_tensors(dense, None)
    ckpt.save(1, [], tensors, rest, {"epoch": 0, "batches": 1, "samples": 1,
                                      "global_samples": 1, "steps": 1})
    if fake:
        rng.set(torch.zeros(16, dtype=torch.uint8))  # the generator moves on
    else:
        torch.cuda.manual_seed(123)
    assert not torch.equal(rng.get(), saved)
    assert Checkpointer(CheckpointConfig(dir=str(tmp_path)), "run").restore([], dense, None)
    assert torch.equal(rng.get(), saved)
