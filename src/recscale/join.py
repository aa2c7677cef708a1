"""``recscale join``: what every host but the driver runs to take part in a job across hosts.

    recscale join --endpoint 10.0.0.1:29400 --secret-file job.secret

The driver runs ``kedro run --pipeline=dlrm --env=cluster`` (its ``train.launch.rdzv_endpoint``
is the address given here); this host reads the job from the driver (configs, plan, data
manifest; never a local config), verifies it with the job's secret (``--secret-file``, or
``RECSCALE_JOB_SECRET``; refused, having written nothing, when the secret differs or the job was
altered), refuses to run if its code differs from the driver's, starts its share of the workers
and leaves when the job ends. It waits ``--timeout`` seconds for the
driver to answer (the driver prepares data and plans before it serves the job).
"""

from __future__ import annotations

import argparse
import logging
import sys

log = logging.getLogger("recscale.join")


def join_main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="recscale join", description=__doc__.split("\n\n")[0])
    p.add_argument("--endpoint", required=True, help="the driver's train.launch.rdzv_endpoint "
                   "(host:port)")
    p.add_argument("--timeout", type=float, default=600.0,
                   help="seconds to wait for the driver to answer (default 600)")
    p.add_argument("--secret-file", default=None, help="the file holding the job's secret (the "
                   "driver's train.launch.secret_file, or the job.secret its log named); default: "
                   "RECSCALE_JOB_SECRET")
    args = p.parse_args(argv)
    if ":" not in args.endpoint or not args.endpoint.rsplit(":", 1)[1].isdigit():
        p.error(f"--endpoint={args.endpoint!r} is not allowed: expected host:port")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("torch.distributed.elastic", "torch.distributed.launcher"):
        logging.getLogger(noisy).setLevel(logging.WARNING)

    from recscale.distributed.job_secret import JobSecretError, host_secret
    from recscale.distributed.job_store import JobError, driver_answers, join
    from recscale.train.job_worker import check_job_here, job_worker

    try:
        secret = host_secret(args.secret_file)
    except JobSecretError as exc:
        log.error("%s", exc)
        return 2
    log.info("joining the job of the driver at %s (waiting up to %g s for it)", args.endpoint,
             args.timeout)
    try:
        results = join(job_worker, args.endpoint, args.timeout, secret, check=check_job_here)
    except JobError as exc:
        log.error("%s", exc)
        return 2
    except Exception as exc:  # noqa: BLE001 - reported, then exit 1
        if not driver_answers(args.endpoint):
            log.error("the driver at %s is gone (its rendezvous store does not answer), so the "
                      "job ended on this host too. Rerun the driver's command: the job resumes "
                      "from its last checkpoint (then run this command again here).\nWhat the "
                      "workers here saw: %s: %s", args.endpoint, type(exc).__name__,
                      str(exc).splitlines()[0][:500] if str(exc) else "")
        else:
            log.error("the job ended with an error on this host: %s: %s", type(exc).__name__,
                      str(exc)[:3000])
        return 1
    run = results[min(results)]
    r0 = run["ranks"][min(run["ranks"])]
    log.info("the job finished: %d steps, final loss %.4f; this host ran ranks %s",
             r0["steps"], r0["final_loss"], sorted(results))
    return 0


if __name__ == "__main__":
    sys.exit(join_main())
