"""dataset_manifest: the data version the model trains on."""

import dagster as dg

from aieng_core.dataset import dataset_manifest as manifest
from orchestration.assets.tokenizer import bpe_tokenizer, tokenized_documents
from orchestration.check_support import verify_current
from orchestration.metadata import materialize_one, run_info, table
from orchestration.partitions import single_run
from orchestration.resources import AiengResource


@dg.asset(
    key=manifest.KIND,
    deps=[dg.AssetDep(tokenized_documents, partition_mapping=dg.AllPartitionMapping()), bpe_tokenizer],
    backfill_policy=single_run,
    code_version=manifest.CODE_VERSION,
    group_name="dataset",
    kinds={"json"},
    description=(
        "SHA-256 of every tokenized partition present and of the tokenizer, with a deterministic train/validation "
        "split by document id, and the train/validation token streams training memory-maps (train.bin, "
        "validation.bin). Its data version is the dataset version."
    ),
)
def dataset_manifest(context: dg.AssetExecutionContext, aieng: AiengResource) -> dg.MaterializeResult:
    artifact = manifest.build_dataset_manifest(aieng.store(), aieng.settings(), run_info(context), context.log)
    dataset = manifest.read_dataset(artifact)
    totals = dataset["totals"]
    return materialize_one(
        artifact,
        {
            "partitions": len(dataset["partitions"]),
            "rows": totals["rows"],
            "tokens": totals["tokens"],
            "train_tokens": totals["train_tokens"],
            "validation_tokens": totals["validation_tokens"],
            "tokenizer_id": dataset["tokenizer_id"],
            "token_dtype": dataset["token_files"]["train"]["dtype"],  # of train.bin and validation.bin
            "partition_table": table(
                dataset["partitions"], ["partition", "rows", "tokens", "train_rows", "validation_rows", "sha256"]
            ),
        },
    )


@dg.asset_check(asset=dataset_manifest, blocking=True, description="The manifest artifact matches its file hashes.")
def dataset_manifest_intact(aieng: AiengResource) -> dg.AssetCheckResult:
    return verify_current(aieng.store(), dataset_manifest.key.to_user_string(), [None])


CHECKS = [dataset_manifest_intact]
