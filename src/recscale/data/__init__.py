"""Data: Criteo TSV format, synthetic generator, preprocessing to parquet, batch type, loaders."""
