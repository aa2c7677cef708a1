"""The cost model's measurement run for real: its output is a topology the planner accepts (file
round trip, a valid plan from it), the training node's predicted / measured step time reaches
MLflow, the link between hosts is measured one process per host, two ranks measure the run's
exchange, and calibrations kept beside a topology merge into their median."""

import dataclasses
import re

import numpy as np
import pytest

from recscale.config import ConfigError, parse
from recscale.measure import CalibrationConfig, CalibrationError, calibrate, fit_calibration
from recscale.runconfig import DLRMConfig
from recscale.sharding import ShardingConfig, TableSpec, Topology, plan_sharding
from recscale.sharding.topology import CALIBRATED

# one rank per host (measured in this process), one dim, one pooling, memory + SSD-backed cache:
# about a second
TINY = CalibrationConfig(dims=(16,), poolings=(2,), batch_sizes=(64, 256), tables=2, rows=2000,
                         cache_rows=5000, tiers=("memory", "ssd"), reps=1, rounds=2,
                         min_seconds=600, max_rounds=3)  # 3 sweeps: the cap ends them
ONE = Topology.preset("cpu-local", world_size=1)


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    scratch = tmp_path_factory.mktemp("scratch")
    return calibrate(ONE, dataclasses.replace(TINY, scratch_dir=str(scratch)))


def test_calibration_output_round_trips_as_a_topology(calibrated, tmp_path):
    topo = calibrated.topology
    assert topo.calibrated and topo.name == "cpu-local-calibrated"
    # timings vary; what is asserted is that every constant was written and the SSD tier exists
    assert all(getattr(topo, k) >= 0 for k in CALIBRATED) and topo.dense_flops > 0
    assert topo.ssd_bw > 0 and topo.ssd_bytes > 0 and "ssd" in topo.tiers
    path = topo.save(tmp_path / "topology.yml")
    assert Topology.load(path) == topo
    # sharding.topology accepts the file; its world size follows the run's
    cfg = ShardingConfig(topology=str(path))
    assert cfg.topology_for(1) == topo
    two = ShardingConfig(topology=str(path), local_world_size=2).topology_for(2)
    assert (two.world_size, two.local_world_size, two.ddr_bytes) == (2, 2, topo.ddr_bytes / 2)
    # a preset's dict (and so every plan made from a preset) has no measured-only keys
    assert not set(CALIBRATED) & set(Topology.preset("zionex").to_dict())
    assert set(calibrated.metrics()) >= {"calibration.memory.id_s", "calibration.memory.row_s",
                                         "calibration.ssd_cache.row_s", "calibration.ssd_cache.bw",
                                         "calibration.dense.flops", "calibration.assembly.s"}
    # ids drawn uniform and skewed (the data's kind): the skewed batches repeat ids, which the
    # update term counts once
    for part in ("memory", "ssd_cache"):
        pts = calibrated.points[part]
        assert {p["skew"] for p in pts} == set(TINY.skews)
        assert all(p["distinct"] < 0.9 * p["ids"] for p in pts if p["skew"] > 0)
        assert all(p["distinct"] <= p["ids"] for p in pts)


def test_a_plan_from_a_calibrated_topology_is_valid(calibrated):
    topo = calibrated.topology.for_world(2, 2)
    tables = [TableSpec(f"t{i}", 1000 * (i + 1), 16 if i % 2 else 128, 1.0 + i) for i in range(8)]
    plan = plan_sharding(tables, topo, 256)
    for tp, spec in zip(plan.tables, tables):
        if tp.sharding_type == "data_parallel":
            continue
        cells = sum(s.row_length * s.col_length for s in tp.shards)
        assert cells == spec.num_embeddings * spec.embedding_dim, tp.name
    for r in plan.ranks:
        for t in topo.tiers:
            assert r.memory(t) <= topo.capacity(t)
    # the plan carries the measured topology and reads back equal
    from recscale.sharding import ShardingPlan

    assert ShardingPlan.from_dict(plan.to_dict()).topology == topo


def test_predicted_over_measured_step_time_reaches_mlflow(parquet_dataset, calibrated, tmp_path,
                                                          monkeypatch):
    import mlflow
    from kedro_mlflow.io.metrics import MlflowMetricsHistoryDataset

    from recscale.pipelines.sharding.nodes import plan_tables
    from recscale.pipelines.training.nodes import train_model

    cfg = parse(DLRMConfig, {
        "model": {"embedding_dim": 16, "bottom_mlp": [32, 16], "top_mlp": [32, 1]},
        "train": {"batch_size_per_rank": 512, "progress": "off", "max_steps": 3,
                  "checkpoint": {"dir": None}}}, "")
    plan, *_ = plan_tables(parquet_dataset, cfg, {"topology": calibrated.topology.to_dict()})
    assert plan["topology"]["name"] == "cpu-local-calibrated"
    *_, metrics, _resolved, _figures, report = train_model(parquet_dataset, plan, cfg)
    for key in ("rank0.step_ms.predicted", "rank0.compute_ms.predicted",
                "rank0.step_ms.measured_over_predicted", "step_ms.measured_over_predicted"):
        assert key in metrics
    assert "step time per rank, predicted vs measured" in report
    # measured is the step after the warm-up (the loop counted the first 2 of the 3 apart)
    assert metrics["rank0.warmup_ms"]["value"] > 0
    assert metrics["step_ms.measured"]["value"] == pytest.approx(
        metrics["rank0.step_ms"]["value"])
    monkeypatch.chdir(tmp_path)
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")
    with mlflow.start_run() as run:
        MlflowMetricsHistoryDataset(prefix="train").save(metrics)
    got = mlflow.tracking.MlflowClient().get_run(run.info.run_id).data.metrics
    assert got["train.step_ms.measured_over_predicted"] == pytest.approx(
        metrics["step_ms.measured_over_predicted"]["value"])
    assert got["train.rank0.comm_ms.predicted"] == pytest.approx(
        metrics["rank0.comm_ms.predicted"]["value"])


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_link_between_hosts_is_measured_by_one_process_per_host(tmp_path, capsys):
    """Host 1 runs the CLI, host 0 (here) the library; host 0's file is the base with the
    link's latency and bandwidth and its CPU cost, fitted on training steps run across the
    link with host 0's base and dense arch (host 1 is given neither), and a host that never
    comes is named with the endpoint."""
    import os
    import subprocess
    import sys

    import torch

    from recscale.measure.cli import calibrate_main
    from recscale.sharding import Topology

    ep = f"127.0.0.1:{_free_port()}"
    threads, ifname = torch.get_num_threads(), os.environ.get("GLOO_SOCKET_IFNAME")
    # a calibrated host (its exchange measured): the link's CPU cost is fitted against it
    base = dataclasses.replace(Topology.preset("cpu-local", world_size=2, local_world_size=1),
                               exchange_bw=1.2e9, dense_flops=5e10)
    base_file = base.save(tmp_path / "base.yml")
    peer = subprocess.Popen([sys.executable, "-m", "recscale", "calibrate", "--link-endpoint", ep,
                             "--link-rank", "1", "--link-hosts", "2", "--reps", "1", "--rounds",
                             "1", "--tables", "4", "--batch", "256"],
                            env=dict(os.environ, DO_NOT_TRACK="true"), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        rc = calibrate_main(["--link-endpoint", ep, "--link-rank", "0", "--link-hosts", "2",
                             "--reps", "1", "--rounds", "1", "--tables", "4", "--batch", "256",
                             "--base", str(base_file), "--bottom-mlp", "8,16",
                             "--top-mlp", "8,1", "--out", str(tmp_path / "t.yml")])
        out, _ = peer.communicate(timeout=60)
    finally:
        peer.kill()
    assert rc == 0 and peer.returncode == 0, out
    # the caller's process is left as it was: its threads, no gloo interface of the link's
    assert (torch.get_num_threads(), os.environ.get("GLOO_SOCKET_IFNAME")) == (threads, ifname)
    got = Topology.load(tmp_path / "t.yml")
    # measured (a latency per call may fit to 0 where the bytes explain the time)
    assert got.inter_node_lat_s >= 0 and got.inter_node_bw > 0
    assert got.inter_node_bw != base.inter_node_bw
    assert got.inter_node_cpu_s >= 0 and got.inter_node_cpu_bw >= 0
    assert dataclasses.replace(got, inter_node_lat_s=0.0, inter_node_bw=base.inter_node_bw,
                               inter_node_burst_bytes=0.0, inter_node_cpu_s=0.0,
                               inter_node_cpu_bw=0.0) == base
    # the steps it was fitted on, at each dim, on both hosts
    for text in (capsys.readouterr().out, out):
        assert re.search(r"the training step across the link at dim 16: [0-9.]+ ms measured "
                         r"\([0-9.]+ communicating\), [0-9.]+ ms predicted .*\([0-9.]+\), "
                         r"[0-9.]+ MB sent across", text), text
        assert "the training step across the link at dim 128" in text
        assert re.search(r"the link's rate: the exchange alone [0-9.]+ MB/s, x [0-9.]+ in the "
                         r"training steps", text), text
    with pytest.raises(CalibrationError, match=rf"2 hosts did not all reach {ep}"):
        from recscale.measure import measure_link

        measure_link(0, 2, ep, TINY, timeout_s=2)


def test_a_calibration_sweeps_its_rounds_then_until_its_cap(calibrated):
    """The module's calibration: rounds 2, a minimum time it cannot reach, capped at 3 sweeps."""
    assert calibrated.sweeps == 3 and calibrated.metrics()["calibration.sweeps"] == 3.0


def test_calibrations_taken_apart_merge_into_one_topology(calibrated):
    """A calibration's topology is its points' fit (``fit_calibration``), so calibrations taken
    at different times merge: the median of their points, refitted."""
    from recscale.measure.timing import median_of_rounds

    refit = fit_calibration(ONE, calibrated.points, TINY, 26)
    assert refit.fits == calibrated.fits
    # the same, but for the SSD tier's free space, read when fitting (other tests write files)
    assert refit.topology.ssd_bytes > 0
    assert dataclasses.replace(refit.topology, ssd_bytes=calibrated.topology.ssd_bytes) == \
        calibrated.topology
    slow = {part: [{k: 2 * v if k == "seconds" else v for k, v in p.items()} for p in pts]
            for part, pts in calibrated.points.items()}
    merged = fit_calibration(ONE, median_of_rounds([calibrated.points, slow, slow]), TINY, 26)
    # every time doubled (the median of one sweep and two slow ones): twice the seconds per
    # item (the tiny calibration's rates may fit at their caps: only the seconds are compared).
    # The compute tier's exactly; a slow tier's within 1%: its fit subtracts what the compute
    # tier's fit says the hits cost, and a bandwidth fitted at its cap (1e12 B/s) stays there
    # rather than halving (a run measured ssd_row_s 0.22% off)
    per_item = [k for k in CALIBRATED if k.endswith("_s") and getattr(calibrated.topology, k)]
    assert per_item
    slow_tiers = tuple(f"{t}_" for t in ("hbm", "ddr", "ssd") if t != ONE.compute_tier)
    for k in per_item:
        rel = 1e-2 if k.startswith(slow_tiers) else 1e-3
        assert getattr(merged.topology, k) == pytest.approx(2 * getattr(calibrated.topology, k),
                                                            rel=rel), k


def test_calibrations_kept_beside_the_topology_merge_into_their_median(calibrated, tmp_path,
                                                                      capsys, monkeypatch):
    """``recscale calibrate --merge``: each calibration's points are kept beside the topology
    file (the last ``keep``), and the topology written is the fit of their median, so
    calibrations taken at different times (a machine whose speed drifts for minutes) sample the
    machine, not one spell of it; a file from another config is refused naming what differs."""
    from recscale.measure.cli import calibrate_main
    from recscale.measure.history import merge_calibrations, points_path
    from recscale.measure.timing import median_of_rounds

    path = points_path(tmp_path / "topology.yml")
    assert path == str(tmp_path / "topology.points.json")
    slow = dataclasses.replace(calibrated, points={
        part: [{k: 2 * v if k == "seconds" else v for k, v in p.items()} for p in pts]
        for part, pts in calibrated.points.items()})
    got, n = merge_calibrations(ONE, calibrated, path, TINY, 26)
    assert n == 0 and got is calibrated
    for k, history in ((1, [calibrated, slow]), (2, [calibrated, slow, slow])):
        got, n = merge_calibrations(ONE, slow, path, TINY, 26)
        want = fit_calibration(ONE, median_of_rounds([c.points for c in history]), TINY, 26)
        assert n == k and got.fits == want.fits
        assert dataclasses.replace(got.topology, ssd_bytes=0) == \
            dataclasses.replace(want.topology, ssd_bytes=0)
    # the oldest dropped past ``keep``: the median of slow, slow = slow
    got, n = merge_calibrations(ONE, slow, path, TINY, 26, keep=2)
    assert n == 1 and got.fits == fit_calibration(ONE, slow.points, TINY, 26).fits
    wider = dataclasses.replace(TINY, dims=(16, 128))
    with pytest.raises(CalibrationError, match=r"they measured dims=\[16\], this one "
                                               r"dims=\[16, 128\]; remove the file"):
        merge_calibrations(ONE, calibrated, path, wider, 26)
    merge_calibrations(ONE, calibrated, path, wider, 26, merge=False)  # replaced, not merged
    # the sharding node: every run's calibration kept in sharding.calibration_history
    import recscale.measure.for_run as for_run
    from recscale.pipelines.sharding.nodes import calibrate_topology

    monkeypatch.setattr(for_run, "calibrate", lambda *a, **k: calibrated)
    history = str(tmp_path / "node.points.json")
    node_cfg = parse(DLRMConfig, {"sharding": {"calibrate": True, "calibration_history": history,
                                               "topology": "cpu-local", "world_size": 1},
                                  "train": {"progress": "off"}}, "")
    man = {"table_sizes": [100] * 26}
    (first, m1), (second, m2) = (calibrate_topology(man, node_cfg) for _ in range(2))
    assert m1["calibration.merged"]["value"] == 0 and m2["calibration.merged"]["value"] == 1
    # the median of one calibration's points twice is its fit (but for the SSD's free space)
    assert dataclasses.replace(Topology.from_dict(second["topology"]), ssd_bytes=0) == \
        dataclasses.replace(Topology.from_dict(first["topology"]), ssd_bytes=0)
    with pytest.raises(ConfigError, match=r"sharding\.calibration_history='h\.yml' "):
        parse(DLRMConfig, {"sharding": {"calibration_history": "h.yml"}}, "")
    # the CLI: a second calibration with --merge writes the median of both
    out = tmp_path / "cli" / "topology.yml"
    args = ["--out", str(out), "--dims", "16", "--batch", "64", "--tiers", "memory",
            "--no-comms", "--ranks-per-host", "1", "--reps", "1", "--rounds", "1",
            "--min-seconds", "0", "--progress", "off"]
    assert calibrate_main(args) == 0 and calibrate_main(args + ["--merge"]) == 0
    assert "the median with 1 earlier calibration(s)" in capsys.readouterr().out
    assert Topology.load(str(out)).dense_flops > 0


def test_two_ranks_measure_the_runs_exchange_at_the_runs_sizes(tmp_path):
    """A host's 2 ranks calibrate at the same time; the runtime's exchange is measured with the
    run's tables at the run's batch (a collective's rate changes with the message size), and its
    fitted constants are written into the topology."""
    cfg = dataclasses.replace(TINY, scratch_dir=str(tmp_path), tiers=("memory",), rounds=1,
                              max_rounds=2, comm_sizes=(1 << 12, 1 << 16))
    cal = calibrate(Topology.preset("cpu-local", world_size=2), cfg, num_tables=6,
                    progress_mode="off")
    assert cal.sweeps == 2  # both ranks swept again on rank 0's clock (else: a deadlock)
    pts = cal.points["exchange"]
    assert {(p["tables"], p["batch"]) for p in pts} == {(6, 256)}
    assert {p["precision"] for p in pts} == {"fp32", "fp16"}
    assert all(p["bytes"] > 0 and p["calls"] >= 4 for p in pts)
    topo = cal.topology
    assert topo.intra_node_bw > 0 and topo.exchange_bw > 0 and topo.local_world_size == 2
    # the runtime's training steps on the host's ranks, and the exchange's work fitted on them
    steps = cal.points["host_steps"]
    assert [(p["dim"], p["batch"], p["tables"], p["ranks"]) for p in steps] == [(16, 256, 6, 2)]
    assert all(p["seconds"] > p["comm"] > 0 for p in steps)
    f = cal.fits["host_steps"]
    assert topo.exchange_bw == pytest.approx(cal.fits["exchange"]["cpu_bw"] * f["factor"])
    assert f["fit_rel_err"] <= f["rel_err_at_1"]
    assert "calibration.host_steps.factor" in cal.metrics()


def test_the_exchanges_work_is_the_one_at_which_the_hosts_training_steps_are_predicted():
    """Steps on one host measured as ``predict_step`` gives them with the exchange's work per
    byte at a known multiple of the exchange alone's (+-3% noise): the fit finds that multiple;
    steps as predicted keep the exchange alone's (1). (The 2-rank calibration test checks that
    the topology gets the factor.)"""
    from recscale.config import to_dict
    from recscale.measure.steps import predict_host_steps, step_plan
    from recscale.model import ModelConfig, dense_spec
    from recscale.sharding import cost_fit as fits
    from recscale.sharding.step_time import predict_step

    host = dataclasses.replace(Topology.preset("cpu-local", world_size=2),
                               ddr_id_s=8e-8, ddr_op_s=5e-4, bag_s=6e-8, assemble_s=3e-9,
                               exchange_op_s=1e-3, exchange_bw=8e8, dense_flops=1e11)
    model = ModelConfig(embedding_dim=16, bottom_mlp=(128, 64, 16), top_mlp=(128, 64, 1))
    rng = np.random.default_rng(7)

    def measured(true, noise=0.0):  # as measure_host_steps records them
        pts = []
        for d in (16, 128):
            mcfg, plan = step_plan(model, d, 26, 20000, 1024, "exact_rowwise_adagrad",
                                   Topology.preset("cpu-local", world_size=2))
            real = predict_step(plan, dense_spec(mcfg, 26, 13), True, topology=dataclasses.replace(
                host, exchange_bw=host.exchange_bw * true))
            pts.append({"dim": d, "batch": 1024, "tables": 26, "rows": 20000, "ranks": 2,
                        "optimizer": "exact_rowwise_adagrad", "model": to_dict(model),
                        "seconds": real.step * rng.uniform(1 - noise, 1 + noise),
                        "comm": max(real.comm)})
        return pts

    true = 2 ** (3 / 8)
    got = fits.fit_exchange_work(predict_host_steps(measured(true), host))
    assert got["factor"] == pytest.approx(true) and got["fit_rel_err"] < 1e-9
    assert got["rel_err_at_1"] > 0.01  # the exchange alone's work predicts the steps worse
    for _ in range(10):
        noisy = predict_host_steps(measured(true, 0.03), host)
        assert fits.fit_exchange_work(noisy)["factor"] == pytest.approx(true, rel=0.25)
        same = predict_host_steps(measured(1.0, 0.03), host)
        assert fits.fit_exchange_work(same)["factor"] == pytest.approx(1.0, rel=0.25)
