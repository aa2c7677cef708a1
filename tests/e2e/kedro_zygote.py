"""`kedro` commands forked from one process that has imported what every command imports.

A `kedro run` spends about 6 of its first 9 s on 2 cores importing Kedro, kedro-mlflow, MLflow,
torch and the project's pipelines; the end-to-end tests start dozens of them. This server imports
those once; for each command it forks a child that becomes the command (its directory, its
environment, its output files, `kedro`'s own entry point and exit), as multiprocessing's fork
server does for the training workers. What a command does after its imports is unchanged:
Kedro's logging is set up again from the child's directory, as a fresh `kedro` sets it up.

Protocol (one JSON object a line): the server prints ``{"ready": pid}`` once imported; each line
it reads is a command ``{"cwd", "args", "env", "stdout", "stderr"}``; it answers
``{"pid": child}`` when the child starts and ``{"pid": child, "rc": status}`` when it ends. It
ends when its input closes. ``tests/e2e/project.py``'s ``kedro`` is the client.
"""

from __future__ import annotations

import json
import os
import sys

# what every `kedro` command imports (the plugins' CLI and hooks, the project's settings and
# pipelines); a command imports anything else itself
PRELOAD = ("kedro.framework.cli", "kedro.framework.cli.cli", "kedro.framework.session",
           "kedro_mlflow.framework.cli.cli", "kedro_mlflow.framework.hooks", "mlflow",
           "mlflow.store.tracking.sqlalchemy_store", "kedro_datasets.matplotlib",
           "recscale.settings", "recscale.pipeline_registry")


def _child(req: dict) -> None:
    """Become ``kedro *args`` in ``cwd`` with ``env``; never returns."""
    code = 1
    try:
        os.setsid()  # its own process group: the client ends it and what it started at once
        out = os.open(req["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        err = os.open(req["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(out, 1)
        os.dup2(err, 2)
        os.close(out)
        os.close(err)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        kedro = os.path.join(os.path.dirname(sys.executable), "kedro")
        sys.argv = [kedro, *req["args"]]
        sys.path[0] = os.path.dirname(kedro)  # as the `kedro` script's own directory is
        from kedro.framework import project

        project.LOGGING.__init__()  # conf/logging.yml of this directory, as a fresh process reads
        from kedro.framework.cli import main

        main()  # click exits with the command's status
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - the command's own traceback, as `kedro` prints it
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            # atexit handlers (MLflow's, the command's) run as at a normal exit
            import atexit

            atexit._run_exitfuncs()
            os._exit(code)


def main() -> None:
    import importlib

    # answers go to the client on this process's own stdout; what the imports print (Kedro's
    # logging writes to stdout) goes to its stderr
    reply = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    for name in PRELOAD:
        importlib.import_module(name)
    print(json.dumps({"ready": os.getpid()}), file=reply, flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        pid = os.fork()
        if pid == 0:
            reply.close()
            _child(req)
        print(json.dumps({"pid": pid}), file=reply, flush=True)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"pid": pid, "rc": os.waitstatus_to_exitcode(status)}), file=reply,
              flush=True)


if __name__ == "__main__":
    main()
