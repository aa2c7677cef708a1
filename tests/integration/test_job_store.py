"""The driver's store for a job across hosts, served in this process: it listens on the
endpoint's address only, holds the job signed (never the secret), and a host reading it with
another secret, or after someone rewrote it, is refused naming what failed."""

import errno
import json
import socket
import threading
import time

import pytest

from recscale.distributed.config import LaunchConfig
from recscale.distributed.job_secret import sign
from recscale.distributed.job_store import (
    JOB_KEY,
    JobError,
    JobServer,
    _client,
    fetch_job,
    make_spec,
)

SECRET = "b5c1" * 16


def _free_port(addr: str) -> int:
    with socket.socket() as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


def test_the_store_listens_on_the_endpoints_address_and_hands_out_only_a_signed_job():
    port = _free_port("127.0.0.2")
    ep = f"127.0.0.2:{port}"
    spec = make_spec(LaunchConfig(world_size=2, nnodes=2, rdzv_endpoint=ep), "run-7",
                     {"out_dir": "/tmp/x"})
    with JobServer(ep, spec, SECRET, timeout_s=5) as server:
        with socket.socket() as s:  # another address of this host: nobody listens there
            with pytest.raises(OSError) as refused:
                s.connect(("127.0.0.1", port))
        assert refused.value.errno == errno.ECONNREFUSED
        assert fetch_job(ep, 5, SECRET) == spec
        published = server.store.get(JOB_KEY).decode()
        assert SECRET not in published and json.loads(published)["key_id"]
        with pytest.raises(JobError, match=r"this host's secret is not the driver's"):
            fetch_job(ep, 5, "another secret")
        # someone who reaches the port rewrites the job, keeping its signature
        forged = json.loads(published)
        forged["spec"]["payload"]["out_dir"] = "/etc"
        _client(ep, 5).set(JOB_KEY, json.dumps(forged))
        with pytest.raises(JobError, match=rf"the job at {ep} was altered after the driver "
                                           r"signed it"):
            fetch_job(ep, 5, SECRET)
        # or signs it with a secret of their own
        _client(ep, 5).set(JOB_KEY, json.dumps(sign(forged["spec"], "theirs")))
        with pytest.raises(JobError, match=r"this host's secret is not the driver's"):
            fetch_job(ep, 5, SECRET)


def test_a_host_started_before_the_driver_gets_the_job_as_soon_as_the_driver_serves_it():
    # TCPStore's own connect retries back off to seconds apart: a host that waited 8 s for the
    # driver would get the job seconds after it was served, and miss the rendezvous' last call
    port = _free_port("127.0.0.2")
    ep = f"127.0.0.2:{port}"
    spec = make_spec(LaunchConfig(world_size=2, nnodes=2, rdzv_endpoint=ep), "run-8", {})
    got: dict = {}

    def host():
        got["spec"] = fetch_job(ep, 30, SECRET)
        got["at"] = time.monotonic()

    t = threading.Thread(target=host, daemon=True)
    t.start()
    time.sleep(8)
    with JobServer(ep, spec, SECRET, timeout_s=30):
        served = time.monotonic()
        t.join(30)
    assert got["spec"] == spec
    assert got["at"] - served < 1.5, f"the job arrived {got['at'] - served:.2f} s after it was served"


def test_a_driver_that_never_serves_is_named_once_the_deadline_passes():
    port = _free_port("127.0.0.2")
    ep = f"127.0.0.2:{port}"
    t0 = time.monotonic()
    with pytest.raises(JobError, match=rf"the driver at {ep} did not answer within 2 s"):
        fetch_job(ep, 2, SECRET)
    assert time.monotonic() - t0 < 5
