"""The job secret without hosts: signing and verifying a spec (another secret, an altered spec, an
unsigned one: each refused naming what failed), where the driver's and a host's secret come from
(the environment, a file, a new 0600 file whose path, not content, is logged), and the path rules
of a verified spec (absolute, normalised, under a declared root, no system directory)."""

import copy
import logging
import os
import stat

import pytest

from recscale.distributed.job_secret import (
    SECRET_ENV,
    JobSecretError,
    check_paths,
    driver_secret,
    host_secret,
    key_id,
    sign,
    verify,
    write_secret,
)

SPEC = {"run_id": "r1", "code_version": "0.1.0+abc", "launch": {"world_size": 4},
        "payload": {"out_dir": "/data/job", "manifest": {"splits": {"train": {"files": ["/d/a"]}}},
                    "roots": {"data": "/d", "output": "/data/job"}}}


def test_a_signed_spec_verifies_with_its_secret_only(seed):
    import random

    secret = f"{random.Random(seed).getrandbits(256):064x}"
    signed = sign(SPEC, secret)
    assert verify(signed, secret, "h:1") == SPEC
    assert secret not in repr(signed)  # the secret itself is not in what the store holds
    other = sign(SPEC, secret)
    assert other["nonce"] != signed["nonce"] and other["signature"] != signed["signature"]
    with pytest.raises(JobSecretError, match=r"this host's secret is not the driver's \(the job "
                                             r"at h:1 was signed with key [0-9a-f]{16}, this host "
                                             r"holds key [0-9a-f]{16}\)"):
        verify(signed, secret + "x", "h:1")


@pytest.mark.parametrize("where", ["payload", "run_id", "nonce", "launch"])
def test_a_spec_altered_after_signing_is_refused(where):
    signed = sign(SPEC, "s3cret")
    forged = copy.deepcopy(signed)
    if where == "payload":
        forged["spec"]["payload"]["out_dir"] = "/etc"
    elif where == "launch":
        forged["spec"]["launch"]["world_size"] = 2
    else:
        forged[where] = forged[where] + "0"
    with pytest.raises(JobSecretError, match=r"the job at h:1 was altered after the driver "
                                             r"signed it"):
        verify(forged, "s3cret", "h:1")


def test_an_unsigned_spec_is_refused():
    with pytest.raises(JobSecretError, match=r"the job at h:1 is not signed"):
        verify(SPEC, "s3cret", "h:1")


def test_the_drivers_secret_comes_from_the_environment_a_file_or_a_new_0600_file(
        tmp_path, monkeypatch, caplog):
    monkeypatch.delenv(SECRET_ENV, raising=False)
    f = tmp_path / "given.secret"
    f.write_text("from-the-file\n")
    assert driver_secret(str(f), str(tmp_path / "out")) == ("from-the-file", str(f))
    with caplog.at_level(logging.WARNING, logger="recscale.distributed.job_secret"):
        secret, where = driver_secret(None, str(tmp_path / "out"))
    assert where == str(tmp_path / "out" / "job.secret") and len(secret) == 64
    assert stat.S_IMODE(os.stat(where).st_mode) == 0o600
    assert open(where).read().strip() == secret
    said = " ".join(r.getMessage() for r in caplog.records)
    assert where in said and secret not in said  # the path is logged, never the secret
    monkeypatch.setenv(SECRET_ENV, "from-the-env")
    assert driver_secret(str(f), str(tmp_path / "out")) == ("from-the-env", SECRET_ENV)
    with pytest.raises(JobSecretError, match=r"train.launch.secret_file='/nonexistent/x' cannot "
                                             r"be read"):
        monkeypatch.delenv(SECRET_ENV)
        driver_secret("/nonexistent/x", str(tmp_path))


def test_a_hosts_secret_comes_from_its_file_or_the_environment_and_none_is_said(
        tmp_path, monkeypatch):
    monkeypatch.delenv(SECRET_ENV, raising=False)
    with pytest.raises(JobSecretError, match=r"this host has no secret for the job: pass "
                                             r"--secret-file"):
        host_secret(None)
    path = write_secret(str(tmp_path / "s"))
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert host_secret(path) == open(path).read().strip()
    with pytest.raises(JobSecretError, match="exists: keep it"):
        write_secret(path)
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(JobSecretError, match=r"--secret-file='.*empty' is empty"):
        host_secret(str(tmp_path / "empty"))
    monkeypatch.setenv(SECRET_ENV, "env-secret")
    assert host_secret(None) == "env-secret"
    assert key_id("env-secret") != key_id("env-secret ") and len(key_id("x")) == 16


@pytest.mark.parametrize("roots, paths, match", [
    ({"data": "/etc"}, {"data": ["/etc/passwd"]}, r"data root '/etc' is a system directory"),
    ({"data": "/"}, {}, r"data root '/' is a system directory"),
    ({"data": "rel/dir"}, {}, r"data root 'rel/dir' is not an absolute, normalised path"),
    ({"data": "/d"}, {"data": ["/d/../etc/passwd"]}, r"path '/d/../etc/passwd' \(data\) is not "
                                                     r"under its data root '/d'"),
    ({"data": "/d"}, {"data": ["/dx/a"]}, r"path '/dx/a' \(data\) is not under"),
    ({"data": "/d"}, {"output": ["/d/o"]}, r"path '/d/o' \(output\) is not under its output "
                                           r"root None"),
    ({"data": "/d"}, {"data": ["d/a"]}, r"path 'd/a' \(data\) is not under"),
])
def test_a_verified_specs_paths_must_lie_under_its_declared_roots(roots, paths, match):
    with pytest.raises(JobSecretError, match=match):
        check_paths(roots, paths)


def test_a_drivers_payload_declares_the_roots_of_every_path_it_holds(tmp_path, parquet_dataset):
    from recscale.config import parse
    from recscale.runconfig import DLRMConfig, plan_for_run
    from recscale.train.job_worker import check_job_paths, job_paths, job_payload

    cfg = parse(DLRMConfig, {"train": {"launch": {"world_size": 2, "nnodes": 2},
                                       "checkpoint": {"dir": str(tmp_path / "ck"),
                                                      "init_from": str(tmp_path / "w" / "step-1")},
                                       "tiers": {"scratch_dir": str(tmp_path / "scratch")}}}, "")
    payload = job_payload(parquet_dataset, cfg, plan_for_run(parquet_dataset, cfg),
                          str(tmp_path / "out"))
    assert set(payload["roots"]) == {"data", "output", "checkpoints", "init", "scratch"}
    assert set(job_paths(payload)) == set(payload["roots"])
    spec = {"payload": payload}
    check_job_paths(spec)  # the driver's own job passes
    payload["config"]["train"]["tiers"]["scratch_dir"] = "/etc/cron.d"
    from recscale.distributed.job_store import JobError

    with pytest.raises(JobError, match=r"path '/etc/cron.d' \(scratch\) is not under its scratch "
                                       r"root"):
        check_job_paths(spec)
