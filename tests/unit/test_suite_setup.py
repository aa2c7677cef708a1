"""The suite's own set-up (tests/conftest.py): what `make test`'s packing of files onto workers
and its sharing of cores depend on."""

import os
import random
from types import SimpleNamespace

from tests import conftest
from tests.conftest import LONGEST_FIRST, PROJECT_ROOT


def test_every_file_started_first_exists_once():
    # a renamed or removed file would drop out of the order without a word
    assert len(set(LONGEST_FIRST)) == len(LONGEST_FIRST)
    missing = [p for p in LONGEST_FIRST if not (PROJECT_ROOT / p).is_file()]
    assert not missing, f"tests/conftest.py LONGEST_FIRST names files that do not exist: {missing}"


def test_the_longest_files_start_first_in_their_order_after_the_random_shuffle(seed):
    # pytest-randomly shuffles in its wrapper before every plain hook; ours sorts after it,
    # stably: the named files first in their order, each file's tests and the rest as shuffled
    rng = random.Random(seed)
    named = rng.sample(LONGEST_FIRST, 4)
    files = [*named, "tests/unit/test_a.py", "tests/unit/test_b.py"]
    items = [SimpleNamespace(nodeid=f"{f}::test_{k}") for f in files for k in range(3)]
    rng.shuffle(items)
    before = [i.nodeid for i in items]
    conftest.pytest_collection_modifyitems(None, items)
    after = [i.nodeid for i in items]
    first = sorted(named, key=LONGEST_FIRST.index)
    assert [n.split("::")[0] for n in after[:12]] == [f for f in first for _ in range(3)]
    for f in files:  # within a file, and among the files not named, the shuffled order
        assert [n for n in after if n.startswith(f)] == [n for n in before if n.startswith(f)]
    rest = [n for n in before if n.split("::")[0] not in named]
    assert after[12:] == rest
    assert conftest.pytest_collection_modifyitems.pytest_impl.get("trylast") is True


def test_torchs_threads_sleep_while_they_wait_in_every_process_the_tests_start():
    # set by tests/conftest.py before torch loads (why: its comment), so every worker, rank and
    # kedro command the tests start inherits it
    assert os.environ.get("OMP_WAIT_POLICY") == "PASSIVE"
