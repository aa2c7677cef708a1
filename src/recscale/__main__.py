"""``recscale`` / ``python -m recscale``: runs the Kedro project like ``kedro run`` does;
``recscale join --endpoint host:port`` takes part in a job across hosts (``recscale.join``);
``recscale calibrate`` measures this machine into a topology file (``recscale.measure.cli``);
``recscale secret`` writes a new secret for jobs across hosts (``recscale.distributed.job_secret``)."""

import sys
from pathlib import Path


def main(*args, **kwargs):
    if not args and sys.argv[1:2] == ["join"]:
        from recscale.join import join_main

        sys.exit(join_main(sys.argv[2:]))
    if not args and sys.argv[1:2] == ["secret"]:
        from recscale.distributed.job_secret import secret_main

        sys.exit(secret_main(sys.argv[2:]))
    if not args and sys.argv[1:2] == ["calibrate"]:
        from recscale.measure.cli import calibrate_main

        sys.exit(calibrate_main(sys.argv[2:]))
    from kedro.framework.cli.utils import find_run_command
    from kedro.framework.project import configure_project

    package_name = Path(__file__).parent.name
    configure_project(package_name)
    interactive = hasattr(sys, "ps1")
    kwargs["standalone_mode"] = not interactive
    run = find_run_command(package_name)
    return run(*args, **kwargs)


if __name__ == "__main__":
    main()
