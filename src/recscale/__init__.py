"""recscale: sharded DLRM training with fbgemm, and distributed Hessian-free optimisation.

The library sub-packages (data, sharding, embedding, comm, model, distributed, runconfig, train,
report, scoring, evaluate, retrain, optim, hf, measure) never import Kedro or MLflow; the Kedro
pipelines under ``recscale.pipelines`` call them (docs/architecture.md maps them).
"""

import logging

__version__ = "0.1.0"

# torch/fbgemm_gpu pairing that is known to load (fbgemm_gpu 1.9.0 and 1.7.0 fail with torch 2.13).
SUPPORTED_PAIR = {"torch": "2.13.0", "fbgemm_gpu": "1.8.0"}


class IncompatibleFbgemmError(ImportError):
    """The installed torch and fbgemm_gpu do not load together."""


def check_fbgemm() -> str:
    """Import fbgemm_gpu and make sure its operators load against the installed torch.

    Returns the fbgemm_gpu version. Raises IncompatibleFbgemmError naming both installed versions and
    the pair that works; a mismatched pair otherwise surfaces later as an obscure undefined-symbol
    error or a missing ``torch.ops.fbgemm`` operator.
    """
    import importlib.metadata as md

    import torch

    def _version(dist: str) -> str:
        try:
            return md.version(dist)
        except md.PackageNotFoundError:
            return "not installed"

    fbgemm_dist = next(
        (d for d in ("fbgemm-gpu-cpu", "fbgemm-gpu") if _version(d) != "not installed"),
        "fbgemm-gpu-cpu",
    )
    installed = f"torch {torch.__version__} with {fbgemm_dist} {_version(fbgemm_dist)}"
    wanted = (
        f"torch=={SUPPORTED_PAIR['torch']} with fbgemm-gpu-cpu=={SUPPORTED_PAIR['fbgemm_gpu']} "
        f"(CPU) or fbgemm-gpu=={SUPPORTED_PAIR['fbgemm_gpu']} (CUDA); install with "
        "`pip install torch==2.13.0` then `pip install -e '.[cpu]'` (or '.[gpu]')"
    )
    # fbgemm_gpu logs one "Successfully loaded: '<library>.so'" line per library (14) at INFO on
    # the root logger as it is imported: library chatter, not progress
    previous = logging.root.manager.disable
    logging.disable(logging.INFO)
    try:
        import fbgemm_gpu  # noqa: F401

        torch.ops.fbgemm.asynchronous_complete_cumsum  # noqa: B018  (forces the op library)
    except Exception as exc:  # undefined symbols raise OSError/ImportError/RuntimeError
        raise IncompatibleFbgemmError(
            f"fbgemm_gpu does not load: installed {installed}; the pair that works is {wanted}. "
            f"Underlying error: {type(exc).__name__}: {str(exc)[:300]}"
        ) from exc
    finally:
        logging.disable(previous)
    return getattr(fbgemm_gpu, "__version__", _version(fbgemm_dist))
