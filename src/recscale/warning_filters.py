"""Warnings kept out of a run's log: library chatter a user of this project cannot act on.

``install`` runs when ``kedro`` starts (the ``kedro.init`` entry point in pyproject.toml, called
before plugins' commands load, which is where kedro-mlflow imports MLflow's model classes) and
again from ``settings.py`` for sessions started without the CLI.
"""

import warnings


def install() -> None:
    # Kedro 1.7 and kedro-mlflow call omegaconf's register_new_resolver, deprecated in the
    # omegaconf they install
    warnings.filterwarnings("ignore", message=r"register_new_resolver\(\) is deprecated",
                            category=UserWarning)
    # kedro-mlflow's KedroPipelineModel (a PythonModel this project does not use) has an untyped
    # predict, which MLflow warns about when the class is defined, under a "once" filter of its
    # own that no filter here outranks; our model's predict is typed. Define the class once, with
    # the warning shown nowhere (the module stays imported; kedro-mlflow's CLI imports it next)
    with warnings.catch_warnings():
        warnings.showwarning = lambda *args, **kwargs: None
        try:
            import kedro_mlflow.mlflow  # noqa: F401
        except ImportError:
            pass
