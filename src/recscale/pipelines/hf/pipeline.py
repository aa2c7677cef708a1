"""``hf`` (MNIST) and ``hf_speech`` (spoken-digit MFCC frames): parse the parameter block ->
preprocess -> train with Hessian-free -> train baselines (SGD with momentum, Adam) -> evaluate.

Only the first node takes ``params:<key>`` (so kedro-mlflow logs every key of the block); it
parses the block once into the job's root config, ``<ds>_config``, which the other nodes take.
"""

from __future__ import annotations

import functools

from kedro.pipeline import Node, Pipeline

from recscale.pipelines.hf import nodes as N


def _bind(fn, key: str):
    return functools.update_wrapper(functools.partial(fn, key=key), fn)


def _training(ds: str, key: str) -> list[Node]:
    """Nodes shared by both pipelines; ``ds`` prefixes the catalog names, ``key`` the params."""
    cfg = f"{ds}_config"
    return [
        Node(N.train_hessian_free, [f"{ds}_splits", cfg],
             [f"{ds}_fit", f"{ds}_model_state", f"{ds}_history", f"{ds}_train_metrics"],
             name=f"{ds}_train_hessian_free"),
        Node(N.train_baselines, [f"{ds}_splits", cfg],
             [f"{ds}_baseline_fits", f"{ds}_baseline_history", f"{ds}_baseline_metrics"],
             name=f"{ds}_train_baselines"),
        Node(_bind(N.evaluate_optimizers, key),
             [f"{ds}_splits", f"{ds}_fit", f"{ds}_baseline_fits", cfg],
             [f"{ds}_test_metrics", f"{ds}_report", f"{ds}_comparison"],
             name=f"{ds}_evaluate"),
    ]


def create_pipeline(**kwargs) -> Pipeline:
    """MNIST (IDX files of the catalog's ``hf_mnist_images`` / ``hf_mnist_labels``)."""
    return Pipeline([
        Node(_bind(N.parse_mnist_job, "hf"), "params:hf", "hf_config", name="hf_parse_config"),
        Node(N.preprocess_mnist, ["hf_mnist_images", "hf_mnist_labels", "hf_config"],
             ["hf_splits", "hf_data_metrics"], name="hf_preprocess"),
        *_training("hf", "hf"),
    ])


def create_speech_pipeline(**kwargs) -> Pipeline:
    """Frame classification on TIMIT-style features (catalog ``hf_speech_frames``)."""
    return Pipeline([
        Node(_bind(N.parse_speech_job, "hf_speech"), "params:hf_speech", "hf_speech_config",
             name="hf_speech_parse_config"),
        Node(N.preprocess_speech, ["hf_speech_frames", "hf_speech_config"],
             ["hf_speech_splits", "hf_speech_data_metrics"], name="hf_speech_preprocess"),
        *_training("hf_speech", "hf_speech"),
    ])
