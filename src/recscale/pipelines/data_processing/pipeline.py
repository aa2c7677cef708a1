from kedro.pipeline import Node, Pipeline

from recscale.pipelines.data_processing.nodes import generate_or_locate_raw, preprocess


def create_pipeline(**kwargs) -> Pipeline:
    return Pipeline(
        [
            Node(generate_or_locate_raw, "params:data", "raw_manifest", name="raw_data"),
            Node(preprocess, ["raw_manifest", "params:preprocess"],
                 ["dataset_manifest", "preprocess_metrics"], name="preprocess"),
        ]
    )
