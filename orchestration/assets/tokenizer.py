"""bpe_tokenizer and tokenized_documents."""

import dagster as dg

from aieng_core.dataset.consistency import tokenized_consistency
from aieng_core.store import Artifact
from aieng_core.tokenizer import bpe_tokenizer as tokenizer_artifact
from aieng_core.tokenizer import tokenized_documents as tokenized
from orchestration.assets.data import clean_documents
from orchestration.metadata import materialize_one, materialize_partitions, run_info
from orchestration.partitions import daily_partitions, single_run
from orchestration.resources import AiengResource


class TokenizerRunConfig(dg.Config):
    # Train again on the clean text present now, even if the config and code version are unchanged.
    retrain: bool = False


@dg.asset(
    key=tokenizer_artifact.KIND,
    deps=[dg.AssetDep(clean_documents, partition_mapping=dg.AllPartitionMapping())],
    backfill_policy=single_run,
    code_version=tokenizer_artifact.CODE_VERSION,
    group_name="tokenizer",
    kinds={"huggingface"},
    description=(
        "Byte-level BPE trained from scratch on the clean text of every partition present. Pinned: a new day "
        "does not retrain it; a config or code-version change, or run config retrain=true, does."
    ),
)
def bpe_tokenizer(
    context: dg.AssetExecutionContext, config: TokenizerRunConfig, aieng: AiengResource
) -> dg.MaterializeResult:
    artifact = tokenizer_artifact.build_bpe_tokenizer(
        aieng.store(), aieng.settings(), config.retrain, run_info(context), context.log
    )
    context.log.info(f"bpe_tokenizer: {'reused' if artifact.reused else 'trained'} {artifact.id}")
    metrics = artifact.metrics
    return materialize_one(
        artifact,
        {
            "vocab_size": metrics["vocab_size"],
            "training_chars": metrics["training_chars"],
            "training_partitions": ", ".join(metrics["training_partitions"]),
        },
    )


@dg.asset(
    key=tokenized.KIND,
    deps=[clean_documents, bpe_tokenizer],
    partitions_def=daily_partitions,
    backfill_policy=single_run,
    code_version=tokenized.CODE_VERSION,
    group_name="tokenizer",
    kinds={"parquet"},
    description="Token ids of each clean document, EOS appended, with the current tokenizer.",
)
def tokenized_documents(context: dg.AssetExecutionContext, aieng: AiengResource) -> dg.MaterializeResult:
    store, config = aieng.store(), aieng.settings()

    def describe(artifact: Artifact) -> dict:
        return {
            "rows": artifact.metrics["rows"],
            "tokens": artifact.metrics["tokens"],
            "tokenizer_id": artifact.metrics["tokenizer_id"],
        }

    return materialize_partitions(
        context,
        lambda p: tokenized.build_tokenized_documents(store, config, p, run_info(context), context.log),
        describe,
    )


@dg.asset_check(
    asset=bpe_tokenizer,
    blocking=True,
    description="Every clean row of every partition encodes without special ids and decodes back to itself.",
)
def tokenizer_round_trips(aieng: AiengResource) -> dg.AssetCheckResult:
    report = tokenizer_artifact.round_trip_report(aieng.store(), aieng.settings().data.batch_rows)
    return dg.AssetCheckResult(
        passed=report["passed"],
        description=f"{report['failures']} of {report['texts_checked']} clean rows do not round-trip"
        if report["failures"]
        else None,
        metadata={
            "partitions_checked": len(report["partitions"]),
            "texts_checked": report["texts_checked"],
            "failures": report["failures"],
            "failing_ids": ", ".join(report["failing_ids"]) or "none",
        },
    )


@dg.asset_check(
    asset=tokenized_documents,
    blocking=True,
    description="One tokenized row per clean row, from the current clean artifact, with the current tokenizer.",
)
def tokenized_matches_clean(aieng: AiengResource) -> dg.AssetCheckResult:
    result = tokenized_consistency(aieng.store())
    return dg.AssetCheckResult(
        passed=result["passed"],
        metadata={
            "partitions_checked": len(result["partitions"]),
            "problems": dg.MetadataValue.json(result["problems"]),
        },
    )


CHECKS = [tokenizer_round_trips, tokenized_matches_clean]
