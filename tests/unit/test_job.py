"""The pieces of a job across hosts that need no hosts: what the driver publishes, the world
size a worker replans for, the record of a shrink and a grow as MLflow gets it."""

import os

import pytest

from recscale.config import parse
from recscale.distributed.job_store import JobError, code_version
from recscale.runconfig import DLRMConfig
from recscale.train.job_worker import check_data_readable, job_payload, with_world_size


def _cfg(**launch):
    return parse(DLRMConfig, {"train": {"launch": {"world_size": 6, "nnodes": "2:3",
                                                   "max_restarts": 2, **launch},
                                        "checkpoint": {"dir": "rel/ck"}}}, "")


def test_the_job_payload_has_absolute_paths_and_no_planner_filled_options(parquet_dataset):
    from recscale.runconfig import plan_for_run

    cfg = _cfg(world_size=2, nnodes=2)
    m = dict(parquet_dataset)
    m["splits"] = {k: dict(v, files=[os.path.relpath(f) for f in v["files"]])
                   for k, v in m["splits"].items()}
    p = job_payload(m, cfg, plan_for_run(parquet_dataset, cfg), "out")
    assert all(os.path.isabs(f) for s in p["manifest"]["splits"].values() for f in s["files"])
    assert p["config"]["train"]["checkpoint"]["dir"] == os.path.abspath("rel/ck")
    assert p["out_dir"] == os.path.abspath("out")
    assert parse(DLRMConfig, p["config"], "") is not None  # the workers parse it back


def test_a_worker_replans_for_the_world_size_the_rendezvous_gave():
    cfg = with_world_size(_cfg(), 4)
    assert (cfg.train.world_size, cfg.train.launch.nnodes, cfg.train.launch.nproc_per_node) \
        == (4, 2, 2)


def test_a_host_that_cannot_read_the_data_is_told_which_file(tmp_path):
    ok = tmp_path / "a.parquet"
    ok.write_bytes(b"x")
    missing = tmp_path / "b.parquet"
    with pytest.raises(JobError, match=rf"this host cannot read {missing} \(train split"):
        check_data_readable({"splits": {"train": {"files": [str(ok), str(missing)]}}},
                            "this host")


def test_the_code_version_names_the_package_version_and_a_hash_of_its_code():
    v = code_version()
    ver, digest = v.split("+")
    assert ver.count(".") >= 2 and len(digest) == 12 and v == code_version()


def test_a_shrink_and_a_grow_reach_mlflow_as_world_size_over_steps():
    from recscale.pipelines.training.nodes import transition_metrics

    t = [{"start_step": 0, "world_size": 6, "replanned": False, "rows_replayed": 0},
         {"start_step": 9, "world_size": 4, "replanned": True, "rows_replayed": 3000},
         {"start_step": 21, "world_size": 6, "replanned": False, "rows_replayed": 1000}]
    m = transition_metrics(t)
    assert m["world_size_over_steps"] == [{"step": 0, "value": 6}, {"step": 9, "value": 4},
                                          {"step": 21, "value": 6}]
    assert (m["attempts"]["value"], m["replans"]["value"], m["rows_replayed"]["value"]) \
        == (3, 1, 4000)
    assert transition_metrics([]) == {}


def test_the_address_that_routes_to_the_rendezvous_and_its_interface():
    from recscale.distributed.netaddr import interface_of, route_addr, split_endpoint

    assert split_endpoint("10.0.0.1:29400") == ("10.0.0.1", 29400)
    assert split_endpoint("[::1]:5") == ("::1", 5)
    assert route_addr("127.0.0.1:29400") == "127.0.0.1"
    assert interface_of("127.0.0.1") == "lo"
    assert interface_of("192.0.2.255") is None  # TEST-NET-1: no interface holds it
