"""Data, from raw rows to the batches training reads: Criteo TSV (``criteo.py``) and multi-hot
parquet (``multihot.py``) formats, the synthetic generator with a planted model and its oracle
(``synthetic.py``), where a run's raw rows come from (``source.py``), preprocessing to parquet
splits with row accounting (``preprocess.py`` on this host, ``spark_preprocess.py`` on Spark,
what both write in ``processed.py``), vocabularies (``vocab.py``), the torchdata loader and the
one ``Batch`` type (``loader.py``, ``batch.py``), an epoch's rows as row positions
(``work.py``), distinct ids per batch for the planner (``stats.py``), and MNIST / spoken-digit
frames for the Hessian-free application (``idx.py``, ``frames.py``)."""
