"""The cost model's measurement without measuring: the fits recover the constants that made known
points (lookups, dense, link rate, burst and CPU cost), the planner's and the fits' bytes are one
formula, a point is the median of its sweeps and a calibration sweeps for its minimum time, the
measurement's config is the run's (batch, tables), and it refuses clearly where it cannot run."""

import dataclasses
import itertools

import numpy as np
import pytest

from recscale.config import ConfigError, parse
from recscale.measure import CalibrationConfig, CalibrationError, calibrate
from recscale.runconfig import DLRMConfig
from recscale.sharding import ShardingConfig, TableSpec, Topology, plan_sharding

# one rank per host (measured in this process), one dim, one pooling, memory + SSD-backed cache:
# about a second
TINY = CalibrationConfig(dims=(16,), poolings=(2,), batch_sizes=(64, 256), tables=2, rows=2000,
                         cache_rows=5000, tiers=("memory", "ssd"), reps=1, rounds=2,
                         min_seconds=600, max_rounds=3)  # 3 sweeps: the cap ends them
ONE = Topology.preset("cpu-local", world_size=1)


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
    cache), as measured on a 2-vCPU VM (dim 128: 6.4, 14.9 and 26.0 ms at 256,
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


def test_calibration_sweeps_for_its_minimum_time(monkeypatch):
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
    with pytest.raises(ConfigError, match=r"calibration\.max_rounds=2 .* >= rounds \(3\)"):
        CalibrationConfig(rounds=3, max_rounds=2)
    with pytest.raises(ConfigError, match=r"calibration\.min_seconds=-1(\.0)? "):
        CalibrationConfig(min_seconds=-1)




def test_the_planner_and_the_fits_count_the_same_bytes_on_random_shards(seed):
    """One byte formula (``cost.lookup_bytes``): on random shards of random tables, what the
    planner charges a compute-tier shard for its lookups (on a preset, no per-item costs: its
    bytes at the tier's rate) is what the fits count for a point of the same ids, distinct ids,
    pooled vectors and dim."""
    from recscale.sharding import PlannerOptions
    from recscale.sharding.cost import TW, CostModel
    from recscale.sharding.cost_fit import point_bytes
    from recscale.sharding.types import OPTIMIZER_STATE, PRECISION_BYTES

    rng = np.random.default_rng(seed)
    for _ in range(50):
        opt = str(rng.choice(["exact_sgd", "exact_rowwise_adagrad", "exact_adagrad"]))
        wp = str(rng.choice(["fp32", "fp16"]))
        B = int(rng.integers(64, 4096))
        topo = Topology.preset("cpu-local", world_size=2 * int(rng.integers(1, 3)))
        cm = CostModel(topo, B, PlannerOptions(optimizer=opt, weight_precision=wp))
        N, L, F = int(rng.integers(100, 10**7)), float(rng.uniform(1, 50)), int(rng.integers(1, 4))
        dim = 4 * int(rng.integers(1, 64))
        U = float(rng.uniform(0.01, 1.0))
        costs = cm.shards(TW, N, L, F, N, dim, 1, 1, 0.0, U)  # tier 1: ddr, the CPU's compute tier
        lookups = B * topo.world_size * F * L
        orow, oelem = (4.0 * x for x in OPTIMIZER_STATE[opt])
        tier_b, compute_b = point_bytes({"ids": lookups, "distinct": U * lookups,
                                         "bags": B * topo.world_size * F, "dim": dim},
                                        float(PRECISION_BYTES[wp]), orow, oelem)
        assert float(costs.compute) * topo.ddr_bw == pytest.approx(tier_b + compute_b, rel=1e-12)
