"""Asset checks. Blocking checks stop downstream steps of the same run. A check of a
partitioned asset looks at the partitions of its run (all present ones when run on its own),
reading the artifacts themselves rather than trusting metadata."""

import dagster as dg

from aieng_core.data.clean_documents import KIND as CLEAN_KIND
from aieng_core.data.clean_documents import row_accounting
from aieng_core.dataset.consistency import tokenized_consistency
from aieng_core.store import ArtifactStore
from aieng_core.tokenizer.bpe_tokenizer import round_trip_report
from orchestration.assets.data import clean_documents, raw_documents
from orchestration.assets.dataset import dataset_manifest
from orchestration.assets.model import model_checkpoint
from orchestration.assets.serving import serving_bundle
from orchestration.assets.tokenizer import bpe_tokenizer, tokenized_documents
from orchestration.partitions import daily_partitions
from orchestration.resources import AiengResource


def run_partitions(context: dg.AssetCheckExecutionContext, store: ArtifactStore, kind: str) -> list[str]:
    """The partitions this run materialized (one, or a backfill range); with no partition
    in the run, every partition present. Keeps a daily run's checks from re-reading a year."""
    tags = context.run.tags
    if "dagster/partition" in tags:
        return [tags["dagster/partition"]]
    if "dagster/asset_partition_range_start" in tags:
        key_range = dg.PartitionKeyRange(
            tags["dagster/asset_partition_range_start"], tags["dagster/asset_partition_range_end"]
        )
        return list(daily_partitions.get_partition_keys_in_range(key_range))
    return store.current_partitions(kind)


def _verify_current(store: ArtifactStore, kind: str, partitions: list[str | None]) -> dg.AssetCheckResult:
    problems = []
    for partition in partitions:
        artifact = store.current(kind, partition)
        if artifact is None:
            problems.append(f"{kind} has no current artifact" + (f" for {partition}" if partition else ""))
            continue
        problems.extend(store.verify(artifact))
    return dg.AssetCheckResult(
        passed=not problems,
        metadata={"artifacts_checked": len(partitions), "problems": dg.MetadataValue.json(problems)},
    )


@dg.asset_check(asset=raw_documents, blocking=True, description="Every snapshot file still matches its SHA-256.")
def raw_snapshot_intact(context: dg.AssetCheckExecutionContext, aieng: AiengResource) -> dg.AssetCheckResult:
    store, kind = aieng.store(), raw_documents.key.to_user_string()
    return _verify_current(store, kind, run_partitions(context, store, kind))


@dg.asset_check(
    asset=clean_documents,
    blocking=True,
    description=(
        "Nothing is dropped silently: the records each landed file holds (counted without the parsers: "
        "lines, Parquet footers) == records read == rows in clean.parquet + quarantine.parquet."
    ),
)
def rows_accounted_for(context: dg.AssetCheckExecutionContext, aieng: AiengResource) -> dg.AssetCheckResult:
    store = aieng.store()
    results = {
        p: row_accounting(store.require_current(CLEAN_KIND, p)) for p in run_partitions(context, store, CLEAN_KIND)
    }
    failed = sorted(p for p, result in results.items() if not result["passed"])
    problems = [f"{p}: {problem}" for p in failed for problem in results[p]["problems"]]
    return dg.AssetCheckResult(
        passed=bool(results) and not failed,
        description=("row counts do not add up: " + "; ".join(problems[:5])) if failed else None,
        metadata={
            "partitions_checked": len(results),
            "failed_partitions": ", ".join(failed) or "none",
            "counts": dg.MetadataValue.json(results),
        },
    )


@dg.asset_check(
    asset=bpe_tokenizer,
    blocking=True,
    description="Every clean row of every partition encodes without special ids and decodes back to itself.",
)
def tokenizer_round_trips(aieng: AiengResource) -> dg.AssetCheckResult:
    report = round_trip_report(aieng.store(), aieng.settings().data.batch_rows)
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


@dg.asset_check(asset=dataset_manifest, blocking=True, description="The manifest artifact matches its file hashes.")
def dataset_manifest_intact(aieng: AiengResource) -> dg.AssetCheckResult:
    return _verify_current(aieng.store(), dataset_manifest.key.to_user_string(), [None])


ALL_CHECKS = [
    raw_snapshot_intact,
    rows_accounted_for,
    tokenizer_round_trips,
    tokenized_matches_clean,
    dataset_manifest_intact,
]


@dg.asset_check(asset=model_checkpoint, blocking=True, description="Every weight is finite: no NaN or inf.")
def weights_finite(aieng: AiengResource) -> dg.AssetCheckResult:
    from aieng_core.model.hf_files import non_finite_tensors  # torch: imported only when a model check runs

    artifact = aieng.store().require_current(model_checkpoint.key.to_user_string())
    bad = non_finite_tensors(artifact)
    return dg.AssetCheckResult(passed=not bad, metadata={"non_finite_tensors": ", ".join(bad) or "none"})


@dg.asset_check(asset=model_checkpoint, blocking=True, description="Validation loss is below the unigram baseline.")
def beats_unigram_baseline(aieng: AiengResource) -> dg.AssetCheckResult:
    metrics = aieng.store().require_current(model_checkpoint.key.to_user_string()).metrics
    return dg.AssetCheckResult(
        passed=metrics["validation_loss"] < metrics["unigram_baseline_loss"],
        metadata={
            "validation_loss": metrics["validation_loss"],
            "unigram_baseline_loss": metrics["unigram_baseline_loss"],
        },
    )


@dg.asset_check(
    asset=model_checkpoint, blocking=True, description="The weights hold exactly the parameters the config implies."
)
def parameter_count_matches_config(aieng: AiengResource) -> dg.AssetCheckResult:
    from aieng_core.model.hf_files import checkpoint_config, stored_parameters
    from aieng_core.model.llama import expected_parameters

    artifact = aieng.store().require_current(model_checkpoint.key.to_user_string())
    stored, expected = stored_parameters(artifact), expected_parameters(checkpoint_config(artifact))
    return dg.AssetCheckResult(passed=stored == expected, metadata={"stored": stored, "expected_from_config": expected})


ALL_CHECKS += [weights_finite, beats_unigram_baseline, parameter_count_matches_config]


@dg.asset_check(
    asset=serving_bundle,
    blocking=True,
    description=(
        "`aieng bundle verify` on the current bundle: every file matches the manifest, the model loads, "
        "and the serving engine replays every golden prompt to the recorded tokens."
    ),
)
def bundle_verified(aieng: AiengResource) -> dg.AssetCheckResult:
    from aieng_core.bundle.verify import verify_bundle

    artifact = aieng.store().require_current(serving_bundle.key.to_user_string())
    report = verify_bundle(artifact.path)
    return dg.AssetCheckResult(
        passed=report["ok"],
        description="; ".join(report["problems"][:3]) or None,
        metadata={
            "bundle_id": artifact.id,
            "files_checked": report["files_checked"],
            "goldens_replayed": len(report["goldens"]),
            "goldens_matching": sum(1 for golden in report["goldens"] if golden["ok"]),
            "problems": dg.MetadataValue.json(report["problems"]),
        },
    )


ALL_CHECKS += [bundle_verified]
