"""recscale.distributed without processes: its config and threads (where it sits in the package
graph, importing no other package, is tests/unit/test_layering.py's)."""

import re

import pytest
import torch

from recscale.config import ConfigError, parse
from recscale.distributed import LaunchConfig, set_threads


def test_launch_config_checks_name_the_full_key():
    assert LaunchConfig(world_size=4, nnodes=2).nproc_per_node == 2
    with pytest.raises(ConfigError, match=r"^train.launch.nnodes=3 is not allowed: expected a "
                                          r"divisor of train.launch.world_size=4"):
        LaunchConfig(world_size=4, nnodes=3)
    with pytest.raises(ConfigError, match=r"^hf.train.launch.exit_timeout_s=0.0 is not allowed"):
        parse(LaunchConfig, {"exit_timeout_s": 0}, "hf.train.launch")
    with pytest.raises(ConfigError, match=r"rdzv_endpoint='localhost' is not allowed: expected "
                                          r"host:port"):
        LaunchConfig(rdzv_endpoint="localhost")


def test_set_threads_shares_the_cores_among_the_local_workers():
    before = torch.get_num_threads()
    try:
        assert set_threads(3) == 3 and torch.get_num_threads() == 3
        cores = torch.multiprocessing.cpu_count()
        assert set_threads(None, local_world_size=2) == max(1, cores // 2)
        assert set_threads(None, local_world_size=10 * cores) == 1
    finally:
        torch.set_num_threads(before)


BLOCK_FLOATS = 16 << 20  # 64 MiB, about a dim-128 dense step's largest activations
BLOCK_PAGES = BLOCK_FLOATS * 4 // 4096


def faults_of_one_step() -> int:
    """Minor page faults of allocating, writing and freeing one BLOCK_FLOATS block, as a step's
    activations are."""
    import resource

    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    x = torch.empty(BLOCK_FLOATS)
    x.fill_(1.0)
    del x
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


def test_a_process_that_trains_keeps_the_memory_a_step_frees():
    """set_threads (every training and calibration process calls it) keeps freed memory in the
    process: a 64 MiB block freed and allocated again, as a step's activations are, comes back
    without page faults (glibc's default maps it afresh each time: 16,384 faults of 4 KiB)."""
    import platform

    from recscale.distributed import keep_freed_memory

    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        assert keep_freed_memory() is False  # another C library's malloc is left as it is
        return
    set_threads(1)
    # the heap grows until freed blocks merge into one that holds it (seen: 1-9 allocations),
    # then the block comes back without faults; glibc's default maps it afresh every time
    faults = [faults_of_one_step() for _ in range(24)]
    assert max(faults[-4:]) < 0.05 * BLOCK_PAGES, faults





@pytest.mark.parametrize("nnodes, why", [
    ("3:2", "'min:max' with 1 <= min <= max"),
    ("0:2", "'min:max' with 1 <= min <= max"),
    ("a:b", "'min:max' with 1 <= min <= max"),
    (0, "a number of hosts >= 1"),
    ("2:3", "a divisor of train.launch.world_size=4"),
])
def test_a_wrong_nnodes_range_names_the_key_and_what_is_allowed(nnodes, why):
    with pytest.raises(ConfigError, match=rf"^train.launch.nnodes={nnodes!r} is not allowed: "
                                          rf"expected .*{re.escape(why)}"):
        parse(LaunchConfig, {"world_size": 4, "nnodes": nnodes, "max_restarts": 1},
              "train.launch")


def test_a_nnodes_range_needs_restarts_and_gives_the_hosts_and_ranks_per_host():
    with pytest.raises(ConfigError, match=r"^train.launch.max_restarts=0 is not allowed: "
                                          r"expected >= 1 with train.launch.nnodes='2:3'"):
        LaunchConfig(world_size=6, nnodes="2:3")
    cfg = LaunchConfig(world_size=6, nnodes="2:3", max_restarts=2)
    assert (cfg.min_nodes, cfg.max_nodes, cfg.nproc_per_node, cfg.multi_host) == (2, 3, 2, True)
    assert not LaunchConfig(world_size=2).multi_host


def test_a_job_across_hosts_needs_a_shared_checkpoint_directory():
    from recscale.runconfig import TrainConfig

    with pytest.raises(ConfigError, match=r"^train.checkpoint.dir=None is not allowed: expected "
                                          r"a directory every host sees"):
        parse(TrainConfig, {"launch": {"world_size": 4, "nnodes": 2}}, "train")


def test_a_base_60_nnodes_says_what_went_wrong_and_a_typed_range_stays_a_string():
    """YAML 1.1 reads an unquoted ``2:3`` as 2 x 60 + 3: where such an integer reaches the key,
    the error says so; the project's ``kedro run`` keeps what was typed in --params."""
    import click
    from click.testing import CliRunner

    from recscale.cli import split_params

    with pytest.raises(ConfigError, match=r"nnodes=123 is not allowed: expected a divisor of "
                                          r"train.launch.world_size=3 .*base-60 integer 123: "
                                          r'write "2:3"'):
        LaunchConfig(world_size=3, nnodes=123, max_restarts=1)
    with pytest.raises(ConfigError) as plain:  # 5 hosts: no such hint
        LaunchConfig(world_size=3, nnodes=5)
    assert "base-60" not in str(plain.value)

    @click.command()
    @click.option("--params", type=click.UNPROCESSED, default="", callback=split_params)
    def show(params):
        click.echo(repr(params))

    got = CliRunner().invoke(show, ["--params=train.launch.nnodes=2:3,train.launch.world_size=3,"
                                    "rdzv=10.0.0.1:29400,lr=0.5,name=a:b"])
    assert got.exit_code == 0, got.output
    assert eval(got.output) == {"train": {"launch": {"nnodes": "2:3", "world_size": 3}},
                                "rdzv": "10.0.0.1:29400", "lr": 0.5, "name": "a:b"}
    # a list or a mapping keeps its commas, beside the other items
    got = CliRunner().invoke(show, ["--params=preprocess.splits=[0.9,0.0,0.1],train.launch.nnodes"
                                    "=2:3,model.top_mlp=[64, 1],x={a: 1, b: [2,3]}"])
    assert got.exit_code == 0, got.output
    assert eval(got.output) == {"preprocess": {"splits": [0.9, 0.0, 0.1]},
                                "train": {"launch": {"nnodes": "2:3"}},
                                "model": {"top_mlp": [64, 1]}, "x": {"a": 1, "b": [2, 3]}}
    got = CliRunner().invoke(show, ["--params=a=[1,2],oops"])
    assert got.exit_code != 0 and "Item `oops` must contain a key and a value" in got.output
