"""The suite's own set-up (tests/conftest.py): what `make test`'s packing of files onto workers
and its sharing of cores depend on."""

import os
import subprocess
import sys

from tests.conftest import LONGEST_FIRST, PROJECT_ROOT


def test_every_file_started_first_exists_once():
    # a renamed or removed file would drop out of the order without a word
    assert len(set(LONGEST_FIRST)) == len(LONGEST_FIRST)
    missing = [p for p in LONGEST_FIRST if not (PROJECT_ROOT / p).is_file()]
    assert not missing, f"tests/conftest.py LONGEST_FIRST names files that do not exist: {missing}"


def test_the_longest_files_are_collected_first_in_their_order():
    files = [*LONGEST_FIRST[:3], "tests/unit/test_suite_setup.py"]
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "randomly",
                          "--randomly-seed=7", *reversed(files)],
                         capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT / "src")})
    assert out.returncode == 0, out.stdout + out.stderr
    order = []
    for line in out.stdout.splitlines():
        path = line.split("::", 1)[0]
        if "::" in line and path not in order:
            order.append(path)
    assert order == files, out.stdout


def test_torchs_threads_sleep_while_they_wait_in_every_process_the_tests_start():
    # set by tests/conftest.py before torch loads, so every worker, rank and kedro command the
    # tests start inherits it (with spinning threads, two copies of test_reinit_embeddings.py side
    # by side on 2 vCPU took 284 s each, not 46)
    assert os.environ.get("OMP_WAIT_POLICY") == "PASSIVE"
