"""Scoring a trained model: its click probabilities on a split of the preprocessed data, every
row accounted for, and their metrics (``split.py``: ``score_split``, ``evaluate_dlrm``, the one
evaluation path of the nodes, the retrain, tests and benchmarks); on raw rows, through
preprocessing's own code (``raw.py``: ``RawScorer``, what the logged model serves); raw files
streamed into one parquet of scores (``files.py``: ``score_files``, the ``score`` pipeline)."""

from recscale.scoring.split import Scores, evaluate_dlrm, score_split

__all__ = ["Scores", "evaluate_dlrm", "score_split"]
