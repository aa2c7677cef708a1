"""Hierarchical collectives on 4 gloo ranks run as 2 plan hosts x 2 ranks: the host-bound
types move fewer inter-host bytes than their flat counterparts, exactly as estimated, and train
exactly like one process."""

import numpy as np
import pytest

from recscale.distributed import LaunchConfig, launch
from recscale.sharding.traffic import estimate_comm_bytes
from tests.distributed import hier_workers as H
from tests.distributed import workers as W
from tests.distributed.test_sharded_parity import assert_equals_single_process, reference

pytestmark = pytest.mark.dist

CFG = LaunchConfig(world_size=H.WORLD, collective_timeout_s=60)
COUNTS = ("input_counts", "hier_input_counts")  # control messages, not in the estimate


def _parity_scenarios():
    tw = "table_wise"
    out = []
    for opt in ("exact_sgd", "exact_rowwise_adagrad"):
        out += [
            {"name": f"twrw/{opt}", "optimizer": opt,
             "plan": H.plan4([tw, tw, "table_row_wise", tw], [0, 3, 1, 2])},
            {"name": f"twcw/{opt}", "optimizer": opt,
             "plan": H.plan4([tw, tw, "table_column_wise", tw], [0, 3, 0, 2])},
            # the two mixes cover all six types, host-bound next to flat
            {"name": f"mixA/{opt}", "optimizer": opt,
             "plan": H.plan4(["data_parallel", "table_row_wise", "table_column_wise", "row_wise"],
                             [0, 1, 0, 0])},
            {"name": f"mixB/{opt}", "optimizer": opt,
             "plan": H.plan4(["table_wise", "column_wise", "table_row_wise",
                              "table_column_wise"], [3, 0, 0, 1])},
        ]
    half = {"forward": "fp16", "backward": "fp16", "dense_allreduce": "fp16"}
    out.append({"name": "mixB/fp16", "optimizer": "exact_sgd", "comms": half,
                "plan": H.plan4(["table_wise", "column_wise", "table_row_wise",
                                 "table_column_wise"], [3, 0, 0, 1])})
    out.append({"name": "mixB/pipelined", "optimizer": "exact_rowwise_adagrad", "pipelined": True,
                "plan": H.plan4(["table_wise", "column_wise", "table_row_wise",
                                 "table_column_wise"], [3, 0, 0, 1])})
    for red in ("flat", "hierarchical", "hierarchical-again"):
        out.append({"name": f"dense/{red}", "optimizer": "exact_sgd",
                    "train": {"dense_reduction": red.split("-")[0]},
                    "plan": H.plan4(["table_wise", "column_wise", "table_row_wise",
                                     "table_column_wise"], [3, 0, 0, 1])})
    # ids with weights through both stages (and the column shards' own update)
    weighted = W.make_global_batches(3, sizes=(5, 9, 3, 7), seed=13, weighted=True)
    for mix, kinds, homes in (("mixA", ["data_parallel", "table_row_wise", "table_column_wise",
                                        "row_wise"], [0, 1, 0, 0]),
                              ("mixB", ["table_wise", "column_wise", "table_row_wise",
                                        "table_column_wise"], [3, 0, 0, 1])):
        out.append({"name": f"{mix}/weighted", "optimizer": "exact_rowwise_adagrad",
                    "steps": weighted, "plan": H.plan4(kinds, homes)})
    for sc in out:
        sc["plan"] = sc["plan"].to_dict()
    return out


SCENARIOS = _parity_scenarios()


@pytest.fixture(scope="module")
def steps():
    return W.make_global_batches(3, sizes=(5, 9, 3, 7), seed=11)


@pytest.fixture(scope="module")
def parity(steps):
    return launch(H.hier_parity_worker, (SCENARIOS, steps), CFG)[0]


@pytest.mark.parametrize("sc", [s for s in SCENARIOS if not {"comms", "train", "pipelined"} & set(s)],
                         ids=lambda s: s["name"])
def test_host_bound_types_train_exactly_like_one_process(parity, steps, sc):
    got = parity[sc["name"]]
    assert_equals_single_process(got, *reference(sc["optimizer"], sc.get("steps", steps)))
    names = set().union(*[set(s) for s in got["bytes"]])
    assert {"hier_input_hosts", "hier_input_local", "hier_output_local", "hier_output_hosts",
            "hier_output_local_grad", "hier_output_hosts_grad"} <= names


def test_the_pipelined_policy_gives_bitwise_the_same_weights(parity):
    """Batch i+1's stage A (across hosts) goes in flight before batch i's stage B and output
    exchanges; the output exchange overlaps the bottom MLP."""
    got, plain = parity["mixB/pipelined"], parity["mixB/exact_rowwise_adagrad"]
    np.testing.assert_array_equal(got["pooled"], plain["pooled"])
    for a, b in zip(got["tables"], plain["tables"]):
        np.testing.assert_array_equal(a, b)
    for k in plain["dense"]:
        np.testing.assert_array_equal(got["dense"][k], plain["dense"][k], err_msg=k)


def test_fp16_comms_go_through_the_hierarchical_path(parity, steps):
    got, full = parity["mixB/fp16"], parity["mixB/exact_sgd"]
    pooled, tables, _ = reference("exact_sgd", steps)
    # two fp16 roundings (inside the host, then across): relative error ~2 x 2^-11
    np.testing.assert_allclose(got["pooled"], pooled, rtol=2e-3, atol=1e-4)
    for t, (a, b) in enumerate(zip(got["tables"], tables)):
        np.testing.assert_allclose(a, b, rtol=1e-2, atol=1e-3, err_msg=f"table {t}")
    for name in ("hier_output_local", "hier_output_hosts", "hier_output_local_grad",
                 "hier_output_hosts_grad"):
        for r in range(H.WORLD):
            assert got["bytes"][r][name]["bytes"] * 2 == full["bytes"][r][name]["bytes"], name


# --- bytes ---------------------------------------------------------------------------------------
BYTE_STEPS = 2


@pytest.fixture(scope="module")
def measured():
    kinds = ["row_wise", "table_row_wise", "column_wise", "table_column_wise"]
    return launch(H.bytes_worker, (kinds, BYTE_STEPS), CFG)[0]


def _split(snaps) -> dict[str, float]:
    """Embedding bytes per step summed over ranks (the DDP hook's and the counts left out)."""
    out = {"intra_host": 0.0, "inter_host": 0.0}
    for snap in snaps:
        for name, v in snap.items():
            if name in COUNTS or name.startswith("dense_"):
                continue
            out["intra_host"] += v["intra_host"] / BYTE_STEPS
            out["inter_host"] += v["inter_host"] / BYTE_STEPS
    return out


@pytest.mark.parametrize("flat,hier", [("row_wise", "table_row_wise"),
                                       ("column_wise", "table_column_wise")])
def test_host_bound_types_move_fewer_inter_host_bytes_exactly_as_estimated(measured, flat, hier):
    got = {k: _split(measured[k]) for k in (flat, hier)}
    est = {k: estimate_comm_bytes(H.bytes_plan(k), lengths_bytes=8) for k in (flat, hier)}
    for k in (flat, hier):
        for side in ("intra_host", "inter_host"):
            assert got[k][side] == pytest.approx(est[k][side], rel=1e-9), (k, side, got, est)
    assert got[hier]["inter_host"] < got[flat]["inter_host"]
    assert est[hier]["inter_host"] < est[flat]["inter_host"]


def test_hierarchical_dense_reduction_equals_the_flat_one_and_repeats_bitwise(parity, steps):
    flat, hier, again = (parity[f"dense/{r}"] for r in ("flat", "hierarchical",
                                                         "hierarchical-again"))
    _, _, dense = reference("exact_sgd", steps)
    for k in dense:
        np.testing.assert_allclose(hier["dense"][k], flat["dense"][k], rtol=1e-5, atol=1e-6,
                                   err_msg=k)
        np.testing.assert_allclose(hier["dense"][k], dense[k], rtol=1e-5, atol=1e-6, err_msg=k)
        np.testing.assert_array_equal(hier["dense"][k], again["dense"][k], err_msg=k)
    for r in range(H.WORLD):
        f, h = flat["bytes"][r], hier["bytes"][r]
        assert "dense_reduce_scatter" not in f and f["dense_allreduce"]["inter_host"] > 0
        # only each rank's slice of a bucket (half of it, padded) crosses hosts
        assert h["dense_reduce_scatter"]["inter_host"] == 0
        assert h["dense_all_gather"]["inter_host"] == 0
        assert 2 * h["dense_allreduce"]["inter_host"] >= f["dense_allreduce"]["inter_host"]
        assert h["dense_allreduce"]["inter_host"] < f["dense_allreduce"]["inter_host"]
