"""Run by tests/distributed/test_torchrun.py under torchrun: the training node as every rank
runs it, then what this rank got (samples trained, a checksum of the model)."""

import json
import os
import sys

from recscale.config import parse
from recscale.pipelines.training.nodes import train_model
from recscale.runconfig import DLRMConfig
from tests.unit.test_distributed import faults_of_one_step


def main(manifest_path: str, plan_path: str, params_path: str, out_path: str) -> None:
    manifest = json.loads(open(manifest_path).read())
    plan = json.loads(open(plan_path).read())
    cfg = parse(DLRMConfig, json.loads(open(params_path).read()), "")
    state, history, _validation, metrics, resolved, figures, _report = train_model(manifest, plan,
                                                                                    cfg)
    checksum = float(sum(v.double().sum() for v in state.values() if v.is_floating_point()))
    # this process goes on after training (a Kedro run): the memory training kept is the OS's
    # again, so a 64 MiB block is mapped afresh the first time after it
    after = [faults_of_one_step() for _ in range(4)]
    with open(out_path, "w") as fh:
        json.dump({"samples": metrics["samples"]["value"], "checksum": checksum,
                   "history_points": len(history["loss"]), "faults_after": after}, fh)


if __name__ == "__main__":
    main(*sys.argv[1:4], sys.argv[4].format(rank=os.environ["RANK"]))
