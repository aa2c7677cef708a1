"""What a run's configuration resolves to on a dataset (``manifest``: the dict preprocessing
writes, ``_manifest.json``: split files, table sizes): its model (``recipe_for``) and its
sharding plan (``plan_for_run``). The entry point, the job's workers (a replan when hosts come
and go), the retrain and the machine's measurement all ask here, so they agree."""

from __future__ import annotations

from recscale.data.schema import FittedSchema
from recscale.data.stats import distinct_fractions
from recscale.model import ModelConfig, ModelRecipe
from recscale.model.dlrm import check_dot_dims
from recscale.runconfig.dlrm import DLRMConfig, TrainConfig
from recscale.sharding import ShardingPlan, Topology, plan_sharding
from recscale.sharding.from_data import table_specs_from_manifest


def recipe_for(manifest: dict, model_cfg: ModelConfig, train_cfg: TrainConfig) -> ModelRecipe:
    """The DLRM a run of ``model_cfg`` / ``train_cfg`` builds on the manifest's fitted schema:
    its dense inputs, its tables' rows and dims (a table's own, else ``model.embedding_dim``)."""
    fitted = FittedSchema.of(manifest)
    dims = fitted.table_dims(model_cfg.embedding_dim)
    if model_cfg.interaction == "dot":
        check_dot_dims(dims, fitted.table_names, bottom=model_cfg.bottom_mlp[-1])
    return ModelRecipe(model_cfg, fitted.table_rows, fitted.num_dense,
                       train_cfg.embedding_optimizer, seed=train_cfg.seed, tiers=train_cfg.tiers,
                       table_dims=dims, feature_tables=fitted.feature_tables(),
                       pooling=fitted.pooling())


def plan_for_run(manifest: dict, cfg: DLRMConfig, measured: Topology | None = None) -> ShardingPlan:
    """The sharding plan of a run: the tables of ``manifest`` on ``sharding.topology`` (or the
    ``measured`` one the machine's measurement made) for ``sharding.world_size`` (null:
    ``train.launch.world_size``) ranks at the run's per-rank batch, with the run's embedding
    optimizer and wire precisions, within ``train.tiers``' RAM budget; the tables' distinct
    fractions measured on the first global batches of the train split."""
    sh, train = cfg.sharding, cfg.train
    topo = train.tiers.budgeted(sh.topology_for(train.world_size, measured))
    opts = {**sh.options.to_dict(), "optimizer": train.embedding_optimizer.name,
            "comms": cfg.comms}
    # the update work of a table is the distinct ids a global batch brings (the data's skew)
    batch = train.batch_size_per_rank * topo.world_size
    distinct = distinct_fractions(manifest, batch, max_batches=max(1, min(4, (1 << 18) // batch)))
    fitted = FittedSchema.of(manifest)
    tables = table_specs_from_manifest(manifest, fitted.table_dims(cfg.model.embedding_dim),
                                       distinct, fitted.feature_tables(), fitted.table_names)
    return plan_sharding(tables, topo, train.batch_size_per_rank, opts)
