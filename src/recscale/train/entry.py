"""The entry point the Kedro nodes (and notebooks) call: train a DLRM run (``train_dlrm``: one
process, sharded over workers, tiered, across hosts, or a rank of torchrun), check that every
train row was trained on, and describe what was trained (``resolved_config``).

``manifest`` is the dict that preprocessing writes (``_manifest.json``): split files, table sizes.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from recscale import __version__
from recscale.comm import CommsConfig
from recscale.config import ConfigError, to_dict
from recscale.data.loader import count_rows
from recscale.data.schema import FittedSchema
from recscale.distributed import (
    in_torchrun,
    launch,
    resolve_device,
    threads_for_run,
    torchrun_ranks_done,
)
from recscale.distributed.job_secret import JobSecretError, driver_secret
from recscale.distributed.job_store import make_spec, serve_and_launch
from recscale.embedding.tier_placement import placements_from_plan
from recscale.embedding.unknown import fill_untrained_rows
from recscale.model import DLRM, ModelConfig, load_state_into, to_cpu_model
from recscale.model.precision import bf16_warning
from recscale.report import TrainResult, summarize
from recscale.runconfig import DLRMConfig, TrainConfig, recipe_for
from recscale.sharding import ShardingConfig, ShardingPlan
from recscale.train.checkpoint import Checkpointer, model_fingerprint
from recscale.train.job_worker import job_payload, job_worker, read_events
from recscale.train.loop import run_loop
from recscale.train.rank import loader_data, sharded_train_worker, validation_data
from recscale.train.runtime import LocalRuntime

log = logging.getLogger(__name__)


@dataclass
class TrainOutcome:
    model: DLRM  # an ordinary in-memory CPU model, whatever device, tier or ranks trained it
    result: TrainResult
    table_sizes: tuple[int, ...]
    threads: int
    device: str


def train_dlrm(manifest: dict, model_cfg: ModelConfig, train_cfg: TrainConfig,
               plan: ShardingPlan | dict | None = None, out_dir: str | None = None,
               comms: CommsConfig | None = None,
               init_state: dict[str, torch.Tensor] | None = None,
               sharded: bool | None = None,
               sharding: ShardingConfig | None = None,
               init_state_table_sizes: Sequence[int] | None = None,
               observer: Callable[[int, dict[str, float]], bool] | None = None) -> TrainOutcome:
    """Train on the manifest's train split: in this process when ``train.launch.world_size`` is
    1, else sharded over that many workers as ``plan`` says (under torchrun: as this process's
    rank; every rank returns the trained model); ``sharded=True`` runs the sharded runtime also
    for one rank. ``init_state``: a state_dict to start from (a warm start; one process), of
    tables ``init_state_table_sizes`` when they are to grow to the manifest's. Checks
    that every train row was trained on, once per epoch.

    Several hosts (``train.launch.nnodes`` > 1 or a range): this process is the driver; it
    publishes the job in its rendezvous store for the hosts that run ``recscale join`` (see
    ``recscale.train.job_worker``); ``sharding`` (the run's sharding block) lets the workers replan
    when hosts are lost or come back.

    ``observer(step, metrics)``: called on rank 0 at each validation point (``train.validation``);
    True ends training there (a tuner's pruner; ``result.extra["pruned_at"]``). It must pickle
    when the run is sharded; a job across hosts takes none."""
    comms = comms or CommsConfig()
    if (slow := bf16_warning(model_cfg.dense_precision, resolve_device(train_cfg.device))):
        log.warning(slow)
    if isinstance(plan, dict):
        plan = ShardingPlan.from_dict(plan)
    rows = count_rows(manifest["splits"]["train"]["files"])
    if rows == 0:
        raise ValueError("the train split is empty: check preprocess.splits and the input data")
    if sharded is None:
        sharded = train_cfg.world_size > 1 or in_torchrun()
    if plan is not None and (sharded or plan.world_size == 1):
        plan.check_matches(batch_size_per_rank=train_cfg.batch_size_per_rank,
                           world_size=train_cfg.world_size, comms=comms if sharded else None)
    if sharded:
        if init_state is not None:
            raise ValueError("init_state (a warm start from a state_dict) runs in one process; "
                             "the sharded runtime warm-starts from train.checkpoint.init_from")
        model, results, transitions = _train_sharded(manifest, model_cfg, train_cfg, comms, plan,
                                                     out_dir, sharding, observer)
        threads = train_cfg.num_threads or 0
    else:
        model, results, threads = _train_local(manifest, model_cfg, train_cfg, plan, init_state,
                                              init_state_table_sizes, observer)
        transitions = []
    result = summarize(results)
    result.transitions = transitions
    check_rows_trained(result, rows, train_cfg)
    log.info("trained %d steps, %d samples: %.0f samples/s in the step, loss %.4f",
             result.steps, result.samples, result.samples_per_s, result.final_loss)
    ex = result.extra or {}
    if ex.get("validation_points"):
        stop = (f"; early stopping ended it at step {ex['stopped_early_at']}"
                if ex.get("stopped_early_at") else "")
        which = "the best step's" if ex.get("restored_best") else "the last step's"
        if ex.get("average_decay"):
            which += f" average of the weights (decay {ex['average_decay']:.4f})"
        log.info("validation: %d points in %.1f s, best %s %.4f at step %d%s; the model is %s",
                 ex["validation_points"], ex["validation_seconds"],
                 train_cfg.early_stopping.metric, ex["best_validation_value"], ex["best_step"],
                 stop, which)
    # rows no update reached (the best step's model, when early stopping restored it) get the
    # trained unknown row: an id that looks one up is as unknown as one never seen
    fill_untrained_rows(model.embeddings, FittedSchema.of(manifest), train_cfg.seed,
                        train_cfg.unknown_ids)
    return TrainOutcome(model, result, tuple(manifest["table_sizes"]), threads,
                        str(resolve_device(train_cfg.device)))


def check_rows_trained(result: TrainResult, rows: int, train_cfg: TrainConfig) -> None:
    """Every train row trained on once per epoch (unless ``max_steps`` cut the run short), also
    across resumes under another world size: the rows before the checkpoint are counted once
    (steps replayed after it belong to the attempt that died, which returns nothing)."""
    expected = rows * train_cfg.epochs
    if result.extra and (result.extra.get("stopped_early_at") or result.extra.get("pruned_at")):
        # early stopping (or a tuner's pruner) ends the run at a step: every rank's rows up to it, no more, no fewer
        if result.samples > expected:
            raise RuntimeError(f"trained on {result.samples} samples, more than the train split's "
                               f"{rows} rows x {train_cfg.epochs} epochs = {expected}")
        return
    if train_cfg.max_steps is None and result.samples != expected:
        how = ""
        if result.extra and result.extra.get("resharded"):
            how = (f" (resumed from a checkpoint of {result.extra['resharded_from']} rank(s) at "
                   f"step {result.extra['reshard_step']})")
        raise RuntimeError(f"trained on {result.samples} samples{how} but the train split holds "
                           f"{rows} rows x {train_cfg.epochs} epochs = {expected}")


def _train_local(manifest, model_cfg, train_cfg, plan, init_state, init_state_table_sizes=None,
                 observer=None):
    # in the caller's process: its threads and memory are its own again after the run
    with threads_for_run(train_cfg.num_threads) as threads:
        model, results = _train_in_process(manifest, model_cfg, train_cfg, plan, init_state,
                                           init_state_table_sizes, observer)
    return model, results, threads


def _train_in_process(manifest, model_cfg, train_cfg, plan, init_state, init_state_table_sizes,
                      observer=None):
    device = resolve_device(train_cfg.device)
    # tables the plan puts on a slower tier (e.g. beyond train.tiers.ram_budget_bytes) train
    # from it behind a cache
    placements = placements_from_plan(plan, manifest["sparse_features"], device.type,
                                      train_cfg.tiers)
    recipe = recipe_for(manifest, model_cfg, train_cfg)
    model = recipe.build(device, placements)
    if init_state is not None:
        load_state_into(model, init_state, recipe, init_state_table_sizes,
                        manifest["sparse_features"])
    ckpt = None
    if train_cfg.checkpoint.dir is not None:
        ckpt = Checkpointer(train_cfg.checkpoint, new_run_id(),
                            fingerprint=model_fingerprint(manifest, model_cfg, train_cfg))
    data = loader_data(manifest, train_cfg, 0, 1, device)
    data.validation = validation_data(manifest, train_cfg, 0, 1)
    if data.validation is not None:
        data.validation.observer = observer
    res = run_loop(LocalRuntime(model, train_cfg, device), data, train_cfg, ckpt)
    if placements is not None or device.type != "cpu":
        model = to_cpu_model(model, recipe)
    return model, {0: res.__dict__}


def _train_sharded(manifest, model_cfg, train_cfg, comms, plan, out_dir, sharding, observer=None):
    if plan is None:
        raise ValueError("train.launch.world_size > 1 needs a sharding plan (the sharding "
                         "pipeline makes one)")
    if in_torchrun() and int(os.environ["WORLD_SIZE"]) != train_cfg.world_size:
        raise ConfigError(f"train.launch.world_size={train_cfg.world_size} is not allowed here: "
                          f"torchrun started {os.environ['WORLD_SIZE']} ranks")
    run_id = new_run_id()  # one id per launch: elastic restarts resume from its checkpoints
    transitions = []
    if train_cfg.launch.multi_host and not in_torchrun():
        if observer is not None:
            raise ConfigError("a validation observer (a tuner's pruner) is not taken by a job "
                              "across hosts (train.launch.nnodes > 1): tune on one host")
        if sharding is None:
            raise ValueError("a job across hosts needs the run's sharding block (train_dlrm("
                             "..., sharding=cfg.sharding)): workers replan when hosts change")
        cfg = DLRMConfig(sharding=sharding, comms=comms, model=model_cfg, train=train_cfg)
        out_dir = out_dir or os.path.join(train_cfg.checkpoint.dir, run_id, "job")
        os.makedirs(out_dir, exist_ok=True)
        spec = make_spec(train_cfg.launch, run_id, job_payload(manifest, cfg, plan, out_dir))
        try:
            secret, source = driver_secret(train_cfg.launch.secret_file, out_dir)
        except JobSecretError as exc:
            raise ConfigError(str(exc)) from None
        log.info("the job's spec is signed with the secret from %s", source)
        local = serve_and_launch(job_worker, spec, secret, lambda r: len(r[min(r)]["ranks"]))
        transitions = read_events(out_dir)
    else:
        # ours to remove once rank 0's model state is read back. Under torchrun every rank
        # reads it from rank 0's directory, so the ranks pass a barrier first (rank 0 removing
        # it early was a race seen in CI); rank 0's is kept where the barrier fails
        scratch = out_dir is None
        out_dir = out_dir or tempfile.mkdtemp(prefix="recscale-train-")
        keep = False
        try:
            local = launch(sharded_train_worker,
                           (manifest, to_dict(model_cfg), to_dict(train_cfg), to_dict(comms),
                            plan.to_dict(), out_dir, run_id, observer), train_cfg.launch)
            run = local[min(local)]
            try:
                model = _load_trained(manifest, model_cfg, train_cfg, run, local)
            finally:
                if scratch and in_torchrun():
                    shared = os.path.dirname(run["state_path"])
                    all_read = torchrun_ranks_done(shared, train_cfg.launch.collective_timeout_s)
                    keep = not all_read and os.path.realpath(shared) == os.path.realpath(out_dir)
            return model, run["ranks"], transitions
        finally:
            if scratch and not keep:
                shutil.rmtree(out_dir, ignore_errors=True)
    run = local[min(local)]  # every rank returns the whole run
    return _load_trained(manifest, model_cfg, train_cfg, run, local), run["ranks"], transitions


def _load_trained(manifest, model_cfg, train_cfg, run: dict, local: dict) -> DLRM:
    """The model rank 0 wrote at the end of a sharded run, as a single-process CPU DLRM."""
    path = run["state_path"]
    if not os.path.exists(path):
        raise RuntimeError(f"ranks {sorted(local)} cannot read the model rank 0 wrote at {path}: "
                           "ranks on several hosts need an output directory they all see")
    model = recipe_for(manifest, model_cfg, train_cfg).build()
    model.load_state_dict(torch.load(path, weights_only=True))
    return model


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:6]


def resolved_config(cfg: DLRMConfig, outcome: TrainOutcome, dataset_manifest: dict,
                    **extra) -> dict:
    """What a trained model was made with: every config block as it ran, the table sizes and the
    runtime (device, threads, versions); ``extra`` adds e.g. the warm start of a retrain."""
    from recscale.embedding import FBGEMM_VERSION

    return {**to_dict(cfg), "table_sizes": list(outcome.table_sizes),
            "schema": FittedSchema.of(dataset_manifest).to_dict(),
            "runtime": {"device": outcome.device, "threads": outcome.threads,
                        "torch": torch.__version__, "fbgemm_gpu": FBGEMM_VERSION,
                        "recscale": __version__},
            "dataset_manifest": dataset_manifest.get("manifest_path"), **extra}
