"""bpe_tokenizer and tokenized_documents."""

from collections.abc import Iterator

import dagster as dg

from aieng_core.data.empty_day import has_no_data
from aieng_core.dataset.consistency import tokenized_consistency
from aieng_core.store import Artifact
from aieng_core.tokenizer import bpe_tokenizer as tokenizer_artifact
from aieng_core.tokenizer import tokenized_documents as tokenized
from aieng_core.tokenizer import tokenizer_inputs
from orchestration.assets.data import clean_documents
from orchestration.metadata import materialize_one, materialize_partitions, run_info, table
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
    # Not materialized while every partition ingested is an empty day (nothing to learn from).
    output_required=False,
    description=(
        "Byte-level BPE trained from scratch on the clean text of every partition present. Pinned: a new day "
        "does not retrain it; a config or code-version change, or run config retrain=true, does."
    ),
)
def bpe_tokenizer(
    context: dg.AssetExecutionContext, config: TokenizerRunConfig, aieng: AiengResource
) -> Iterator[dg.MaterializeResult]:
    try:
        artifact = tokenizer_artifact.build_bpe_tokenizer(
            aieng.store(), aieng.settings(), config.retrain, run_info(context), context.log
        )
    except tokenizer_artifact.NoCleanText as exc:
        # Only empty days so far: nothing to learn from is not a failure. No output, so the
        # steps after it in this run (tokenizing, the dataset manifest) are skipped too.
        context.log.warning(f"bpe_tokenizer: not trained: {exc}")
        return
    context.log.info(f"bpe_tokenizer: {'reused' if artifact.reused else 'trained'} {artifact.id}")
    metrics = artifact.metrics
    yield materialize_one(
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
            "no_data": has_no_data(artifact),
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


@dg.asset_check(
    asset=bpe_tokenizer,
    # Warn, never block: the fix, retraining, changes every token id downstream, so it is a
    # decision for a person, and the pinned tokenizer still works on any text meanwhile.
    blocking=False,
    description=(
        "The partitions the pinned tokenizer was trained on are still current (WARN when one changed or went, "
        "naming them and the command that retrains it); partitions it never saw are listed, not a failure."
    ),
)
def tokenizer_inputs_current(aieng: AiengResource) -> dg.AssetCheckResult:
    report = tokenizer_inputs.tokenizer_inputs_report(aieng.store())
    rows = [
        {
            "partition": entry["partition"],
            "state": entry["state"],
            "trained_on": entry["trained_on"]["clean_documents"] or "",
            "current": entry["current"]["clean_documents"] or "",
            "files_changed": ", ".join(f["name"] for f in entry["files"]),
            "why": entry["why"],
        }
        for entry in report["partitions"]
    ]
    return dg.AssetCheckResult(
        passed=report["passed"],
        severity=dg.AssetCheckSeverity.WARN,
        description=tokenizer_inputs.summary(report),
        metadata={
            "tokenizer_id": report["bpe_tokenizer"],
            **{f"partitions_{state}": count for state, count in report["counts"].items()},
            "partitions": table(rows, ["partition", "state", "trained_on", "current", "files_changed", "why"]),
            "retrain_commands": "\n".join(report["retrain"]),
            "details": dg.MetadataValue.json(report["partitions"]),
        },
    )


CHECKS = [tokenizer_round_trips, tokenized_matches_clean, tokenizer_inputs_current]
