"""Calibration: its output is a topology the planner accepts (file round trip, a valid plan from
it), the training node's predicted / measured step time reaches MLflow, and calibration refuses
with a clear error where it cannot run."""

import dataclasses
import itertools
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


def test_calibration_refuses_a_tier_whose_directory_cannot_be_written(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    cfg = dataclasses.replace(TINY, scratch_dir=str(blocker / "tiers"))
    with pytest.raises(CalibrationError, match=r"SSD-backed cache tier: its directory .*a_file/"
                                               r"tiers' cannot be written"):
        calibrate(ONE, cfg)
    with pytest.raises(CalibrationError, match="device 'cuda'"):
        calibrate(Topology.preset("zionex"), TINY)
    from recscale.measure.cli import calibrate_main

    assert calibrate_main(["--scratch-dir", str(blocker / "x"), "--out",
                           str(tmp_path / "t.yml"), "--progress", "off"]) == 2
    assert not (tmp_path / "t.yml").exists()
    with pytest.raises(ConfigError, match=r"sharding\.topology='nowhere' is not allowed"):
        ShardingConfig(topology="nowhere")
    with pytest.raises(ConfigError, match="topology file .*missing.yml' does not exist"):
        ShardingConfig(topology=str(tmp_path / "missing.yml")).topology_for(2)


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


def test_the_link_fit_finds_a_rate_limiters_burst_and_none_where_there_is_none():
    """Exchange points whose calls were timed through a token bucket (latency + the bytes
    beyond the burst at the rate): the fit recovers the three; the same link without a bucket
    fits a burst of 0, also when its times are as noisy as this machine's (+-15%)."""
    import random

    from recscale.sharding.cost_fit import fit_link

    rng = random.Random(7)
    lat, rate, burst = 2e-4, 1.2e8, 600e3

    def points(b, noise=0.02):
        pts = []
        for dim in (16, 48, 72, 128):
            out = 13 * 1024 * dim * 4 * rng.uniform(0.9, 1.1)  # pooled vectors per call
            by_call = {"ids": [1, 110e3], "lengths": [1, 55e3], "output": [1, out],
                       "output_grad": [1, out]}
            t = sum(c * (lat + max(n - b, 0.0) / rate) for c, n in by_call.values())
            pts.append({"calls": 4.0, "bytes": sum(c * n for c, n in by_call.values()),
                        "by_call": by_call,
                        "comm_seconds": t * rng.uniform(1 - noise, 1 + noise)})
        return pts

    got = fit_link(points(burst))
    assert got["burst_bytes"] == pytest.approx(burst, rel=0.25)
    assert got["bw"] == pytest.approx(rate, rel=0.1) and got["fit_rel_err"] < 0.05
    flat = fit_link(points(0.0))
    assert flat["burst_bytes"] == 0.0 and flat["bw"] == pytest.approx(rate, rel=0.1)
    assert flat["lat_s"] == pytest.approx(lat, rel=0.5)
    assert all(fit_link(points(0.0, noise=0.15))["burst_bytes"] == 0.0 for _ in range(50))


def test_the_links_rate_is_the_one_at_which_the_training_steps_communication_is_predicted():
    """Steps across hosts whose communication is what ``predict_step`` gives at a known multiple
    of the exchange's rate (with +-3% noise): the fit finds that multiple (within a step of the
    grid) and, where the steps communicate as predicted at the exchange's own rate, 1."""
    from recscale.measure.steps import RATE_FACTORS
    from recscale.sharding import cost_fit as fits
    from recscale.sharding.step_time import DenseSpec, predict_step

    link = dataclasses.replace(Topology.preset("cpu-local", world_size=2, local_world_size=1),
                               inter_node_bw=6e8, inter_node_lat_s=8e-4, exchange_bw=1.2e9,
                               dense_flops=1e11)
    rng = np.random.default_rng(3)

    def rate(f):
        return dataclasses.replace(link, inter_node_bw=link.inter_node_bw * f)

    plans = {}
    for d in (16, 128):
        plan = plan_sharding([TableSpec(f"t{i}", 20000, d, 1.0) for i in range(26)], link, 1024)
        dense = DenseSpec.mlps(13, (128, 64, d), 27 * d, (128, 64, 1))
        plans[d] = (plan, dense, [predict_step(plan, dense, topology=rate(f))
                                  for f in RATE_FACTORS])

    def points(true):  # as measure_link_steps records them, the link running at true x
        pts = []
        for d, (plan, dense, at) in plans.items():
            real = predict_step(plan, dense, topology=rate(true))
            pts.append({"dim": d, "seconds": real.step, "comm": max(real.comm),
                        "rate_factors": list(RATE_FACTORS),
                        "predicted_by_rate": [p.step for p in at],
                        "comm_by_rate": [max(p.comm) for p in at]})
        return pts

    def noisy(pts, noise=0.03):
        return [dict(p, comm=p["comm"] * rng.uniform(1 - noise, 1 + noise)) for p in pts]

    true = 2 ** (5 / 8)  # on the grid
    faster, same = points(true), points(1.0)
    got = fits.fit_link_rate(faster)
    assert got["factor"] == pytest.approx(true) and got["fit_rel_err"] < 1e-9
    assert got["rel_err_at_1"] > 0.02  # the exchange's rate alone predicts the steps worse
    for _ in range(20):
        assert fits.fit_link_rate(noisy(faster))["factor"] == pytest.approx(true, rel=0.1)
        assert fits.fit_link_rate(noisy(same))["factor"] == pytest.approx(1.0, rel=0.1)
    assert fits.fit_link_rate(points(0.5))["factor"] == pytest.approx(0.5)


def test_the_links_cpu_cost_is_what_the_training_step_across_hosts_spends_beyond_its_prediction():
    """Training steps across hosts, measured as the host's prediction (link included, no CPU
    cost for it) plus a known cost per byte sent across and per step: the fit finds them, and
    nothing where there is none or where the steps ran faster than predicted; the prediction of
    a 2-host step charges them (per byte on the bytes sent to the other host)."""
    from recscale.sharding import cost_fit as fits
    from recscale.sharding.step_time import predict_step

    host = dataclasses.replace(Topology.preset("cpu-local", world_size=2, local_world_size=1),
                               ddr_id_s=8e-8, ddr_op_s=5e-4, bag_s=6e-8, assemble_s=3e-9,
                               exchange_op_s=4e-3, exchange_bw=1.2e9)
    rng = np.random.default_rng(5)
    pts = [{"dim": d, "predicted": float(p), "bytes_across": float(b), "seconds": float(p)}
           for d, p, b in zip((16, 64, 128), rng.uniform(0.01, 0.08, 3),
                              rng.uniform(1e6, 2e7, 3))]
    none = fits.fit_link_steps(pts)
    assert none["cpu_bw"] == 0.0 and none["cpu_s"] == pytest.approx(0.0, abs=1e-9)
    faster = [dict(p, seconds=0.9 * p["seconds"]) for p in pts]
    assert fits.fit_link_steps(faster)["cpu_s"] == pytest.approx(0.0, abs=1e-9)
    for p in pts:
        p["seconds"] += p["bytes_across"] / 3e8
    got = fits.fit_link_steps(pts)
    assert got["cpu_bw"] == pytest.approx(3e8, rel=1e-6) and got["cpu_s"] == pytest.approx(
        0.0, abs=1e-9)
    for p in pts:  # and a fixed cost a step (the network stack's per call), whatever the bytes
        p["seconds"] += 1.5e-3
    got = fits.fit_link_steps(pts)
    assert got["cpu_bw"] == pytest.approx(3e8, rel=1e-6)
    assert got["cpu_s"] == pytest.approx(1.5e-3, rel=1e-6) and got["fit_rel_err"] < 1e-9
    plan = plan_sharding([TableSpec(f"t{i}", 5000, 64, 2.0) for i in range(4)], host, 256)
    off = predict_step(plan, None)
    on = predict_step(plan, None, topology=dataclasses.replace(host, inter_node_cpu_bw=3e8))
    assert all(b > a for a, b in zip(off.compute, on.compute))
    fixed = predict_step(plan, None, topology=dataclasses.replace(host, inter_node_cpu_bw=3e8,
                                                                  inter_node_cpu_s=1.5e-3))
    assert fixed.compute == pytest.approx(tuple(c + 1.5e-3 for c in on.compute), rel=1e-12)


def test_calibration_measures_at_the_runs_batch(monkeypatch):
    """A step is not linear in the batch far from it, so the sharding pipeline's calibrate node
    and ``recscale calibrate --batch`` measure at the run's batch per rank (and a quarter of it),
    not at fixed sizes."""
    import recscale.measure.for_run as for_run
    import recscale.measure.machine as cal_mod
    from recscale.measure.cli import calibrate_main
    from recscale.measure.config import batch_sizes_for
    from recscale.pipelines.sharding.nodes import calibrate_topology

    seen = []

    def fake(base, cfg, model_cfg, num_tables, *args, **kwargs):
        seen.append((cfg.batch_sizes, cfg.min_seconds))
        tables.append((cfg.table_rows, num_tables))
        raise CalibrationError("stop here")

    tables = []
    monkeypatch.setattr(cal_mod, "calibrate", fake)  # the CLI's
    monkeypatch.setattr(for_run, "calibrate", fake)  # the sharding node's
    cfg = parse(DLRMConfig, {"sharding": {"calibrate": True, "calibration_seconds": 7},
                             "train": {"batch_size_per_rank": 512, "progress": "off"}}, "")
    with pytest.raises(CalibrationError, match="stop here"):
        calibrate_topology({"table_sizes": [100 + i for i in range(26)]}, cfg)
    assert calibrate_main(["--batch", "2000", "--progress", "off", "--out", "/nonexistent/t.yml"]) == 2
    assert seen == [((128, 512), 7.0), ((500, 2000), 20.0)]  # the CLI's default: 20 s
    # the in-memory tier on the run's tables: the node's dataset, the CLI's --table-rows
    assert calibrate_main(["--table-rows", "10,2000,300", "--progress", "off"]) == 2
    assert tables == [(tuple(100 + i for i in range(26)), 26), ((), 26), ((10, 2000, 300), 3)]
    with pytest.raises(ConfigError, match=r"sharding\.calibration_seconds=-2(\.0)? "):
        parse(DLRMConfig, {"sharding": {"calibration_seconds": -2}}, "")
    with pytest.raises(ConfigError, match=r"train\.batch_size_per_rank=4 .* at least 8"):
        batch_sizes_for(4)


def test_the_in_memory_tier_is_measured_on_the_runs_tables(tmp_path, monkeypatch):
    """With ``table_rows`` (the sharding pipeline passes its dataset's) the in-memory module
    holds tables of those sizes (each of a host's ranks its share of their rows), each
    feature's ids drawn in its own table's rows; scaled down alike past the byte budget; a bad
    entry is refused naming the key."""
    import recscale.embedding.tbe as tbe
    from recscale.measure.config import MEMORY_MODULE_BYTES, memory_tables

    built, real = [], tbe.FusedEmbeddingBags

    def recording(rows, dims, *a, **k):
        built.append(list(rows))
        mod = real(rows, dims, *a, **k)
        forward = mod.forward

        def checked(sparse):  # every id inside its own table
            per = sparse.values.split(sparse.lengths.sum(1).tolist())
            assert all(int(v.max()) < n for v, n in zip(per, rows) if v.numel())
            return forward(sparse)

        mod.forward = checked
        return mod

    monkeypatch.setattr(tbe, "FusedEmbeddingBags", recording)
    cfg = dataclasses.replace(TINY, scratch_dir=str(tmp_path), tiers=("memory",), rounds=1,
                              max_rounds=1, min_seconds=0, table_rows=(40, 3000, 120))
    calibrate(ONE, cfg)
    assert built and all(rows == [40, 3000, 120] for rows in built)
    assert memory_tables(TINY) == [2000, 2000]
    # each of a host's 2 ranks, measuring at once, holds about half of the tables' rows
    assert memory_tables(dataclasses.replace(TINY, table_rows=(1000, 3000)), 2) == [500, 1500]
    huge = dataclasses.replace(TINY, dims=(16, 128), table_rows=(10, 10**6, 10**8))
    rows = memory_tables(huge)
    assert sum(rows) * 128 * 4 <= MEMORY_MODULE_BYTES and rows[0] == 1
    assert rows[2] / rows[1] == pytest.approx(100, rel=1e-3)
    with pytest.raises(ConfigError, match=r"calibration.table_rows.*positive integers"):
        dataclasses.replace(TINY, table_rows=(10, 0))


def test_the_lookup_fits_count_each_distinct_row_the_update_writes():
    """Points made from known constants, the update's cost per distinct row included, over the
    calibration's grid (uniform ids: nearly every id a distinct row; power-law: a third): the
    in-memory fit recovers every constant, and the cached tier's fit its misses' own per-row
    cost given the in-memory fit for its hits."""
    from recscale.sharding import cost_fit as fits
    from recscale.sharding.cost import lookup_bytes

    rng = np.random.default_rng(0)
    wb, orow, oelem = 4.0, 4.0, 0.0
    true = {"op_s": 4e-4, "id_s": 2e-8, "bag_s": 3e-8, "bw": 1e10, "row_s": 4.5e-7}
    slow = {"op_s": 6e-4, "id_s": 4e-7, "bw": 3e9, "row_s": 2e-7}
    mem, cached = [], []
    for d, L, B, skew in itertools.product((16, 128), (1, 8), (256, 1024), (0.0, 1.2)):
        ids, bags = 4 * B * L, 4 * B
        distinct = ids * (0.98 if skew == 0 else rng.uniform(0.2, 0.4))
        tb, pb = lookup_bytes(ids, distinct / ids, bags, d, wb, orow, oelem)
        t = (true["op_s"] + ids * true["id_s"] + bags * true["bag_s"] + (tb + pb) / true["bw"]
             + distinct * true["row_s"])
        mem.append({"dim": d, "ids": ids, "bags": bags, "distinct": distinct, "seconds": t})
        h = 0.05 if skew == 0 else 0.5
        t = (ids * h * true["id_s"] + bags * true["bag_s"] + (tb * h + pb) / true["bw"]
             + distinct * h * true["row_s"] + slow["op_s"] + ids * (1 - h) * slow["id_s"]
             + tb * (1 - h) / slow["bw"] + distinct * (1 - h) * slow["row_s"])
        cached.append({"dim": d, "ids": ids, "bags": bags, "distinct": distinct, "seconds": t,
                       "hit_rate": h})
    got = fits.fit_memory(mem, wb, orow, oelem)
    assert got["fit_rel_err"] < 1e-6
    for k, v in true.items():
        assert got[k] == pytest.approx(v, rel=1e-3), k
    got = fits.fit_cached(cached, true, wb, orow, oelem)
    assert got["fit_rel_err"] < 1e-6
    for k, v in slow.items():
        assert got[k] == pytest.approx(v, rel=1e-3), k


def test_the_dense_fit_is_closest_at_the_runs_batch():
    """A dense step that grows faster than its FLOPs at the run's batch (activations leaving the
    cache), as measured on the ninth session's machine (dim 128: 6.4, 14.9 and 26.0 ms at 256,
    640 and 1,024 samples): the fit weights the run's batch, so the prediction there is the
    measurement within a few %, where an even fit was 11% under it."""
    from recscale.sharding import cost_fit as fits

    pts = []
    for d, ms in ((16, (3.2, 5.5, 7.8)), (128, (6.4, 14.9, 26.0))):
        for b, t in zip((256, 640, 1024), ms):
            pts.append({"dim": d, "batch": b, "flops": 4e5 * b * (1 + d / 64),
                        "interaction": 27 * 27 * d * b, "seconds": t * 1e-3})

    def at_run_batch(fit):
        return [p["seconds"] / (fit["op_s"] + p["flops"] / fit["flops"]
                                + p["interaction"] * fit["interaction_s"])
                for p in pts if p["batch"] == 1024]

    assert all(abs(r - 1) < 0.03 for r in at_run_batch(fits.fit_dense(pts)))
    even = fits.fit_dense(pts, run_batch=-1)  # no point at that batch: every point counts once
    assert max(abs(r - 1) for r in at_run_batch(even)) > 0.08


def test_each_point_is_the_median_of_its_sweeps():
    """``rounds`` sweeps over every point, each point's measured numbers the median over them
    (one slow spell of a shared machine does not move a fit); what names a point is kept."""
    from recscale.measure.timing import median_of_rounds

    def sweep(s, h):
        return {"memory": [{"dim": 16, "batch": 256, "seconds": s, "hit_rate": h},
                           {"dim": 128, "batch": 256, "seconds": 2 * s, "hit_rate": 1.0}]}

    got = median_of_rounds([sweep(1.0, 0.5), sweep(9.0, 0.25), sweep(2.0, 0.75)])
    assert got == {"memory": [{"dim": 16, "batch": 256, "seconds": 2.0, "hit_rate": 0.5},
                              {"dim": 128, "batch": 256, "seconds": 4.0, "hit_rate": 1.0}]}
    # a part an older calibration lacks (host steps) comes from those that have it
    steps = {"host_steps": [{"dim": 16, "seconds": 0.02}]}
    got = median_of_rounds([sweep(1.0, 0.5), {**sweep(9.0, 0.25), **steps},
                            {**sweep(2.0, 0.75), "host_steps": [{"dim": 16, "seconds": 0.04}]}])
    assert got["memory"][0]["seconds"] == 2.0 and got["host_steps"] == [{"dim": 16,
                                                                           "seconds": 0.03}]
    with pytest.raises(ConfigError, match=r"calibration\.rounds=0 .* a positive integer"):
        CalibrationConfig(rounds=0)


def test_calibration_sweeps_for_its_minimum_time(monkeypatch, calibrated):
    """``rounds`` sweeps, then more until ``min_seconds`` have passed (a spell of a shared
    machine's cores outlasts a short calibration), at most ``max_rounds``; the progress bar's
    count follows from the first sweep's length."""
    import recscale.measure.config as cc

    clock = [100.0]
    monkeypatch.setattr(cc.time, "perf_counter", lambda: clock[0])

    def count(sweep_s, **kw):
        n = cc.Sweeps(CalibrationConfig(**kw))
        expected = []
        while n.more():  # what the bar shows during each sweep
            expected.append(n.expected)
            clock[0] += sweep_s
            n.finished_one()
        return n.done, expected

    assert count(3.0, rounds=2, min_seconds=10) == (4, [2, 4, 4, 4])  # 12 s >= 10 after 4
    assert count(3.0, rounds=2, min_seconds=10, max_rounds=3) == (3, [2, 3, 3])
    assert count(3.0, rounds=5, min_seconds=10) == (5, [5] * 5)
    assert count(3.0, rounds=2) == (2, [2, 2])
    assert count(30.0, rounds=2, min_seconds=10) == (2, [2, 2])
    # the real calibration (the module's: rounds 2, a minimum it cannot reach, capped at 3)
    assert calibrated.sweeps == 3 and calibrated.metrics()["calibration.sweeps"] == 3.0
    with pytest.raises(ConfigError, match=r"calibration\.max_rounds=2 .* >= rounds \(3\)"):
        CalibrationConfig(rounds=3, max_rounds=2)
    with pytest.raises(ConfigError, match=r"calibration\.min_seconds=-1(\.0)? "):
        CalibrationConfig(min_seconds=-1)


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
    # item (the tiny calibration's rates may fit at their caps: only the seconds are compared)
    per_item = [k for k in CALIBRATED if k.endswith("_s") and getattr(calibrated.topology, k)]
    assert per_item
    for k in per_item:
        assert getattr(merged.topology, k) == pytest.approx(2 * getattr(calibrated.topology, k),
                                                            rel=1e-3), k


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
            real = predict_step(plan, dense_spec(mcfg, 26), True, topology=dataclasses.replace(
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
