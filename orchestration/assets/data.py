"""raw_documents and clean_documents: landing snapshot, data contract, cleaning, quarantine."""

import dagster as dg

from aieng_core.data import clean_documents as clean
from aieng_core.data import raw_documents as raw
from aieng_core.data.empty_day import LANDED, has_no_data
from aieng_core.data.reasons import ALL_REASONS
from aieng_core.data.report import quarantine_samples
from aieng_core.data.tables import CLEAN_FILE, head
from aieng_core.store import Artifact
from orchestration.check_support import run_partitions, verify_current
from orchestration.metadata import materialize_partitions, run_info, table
from orchestration.partitions import daily_partitions, single_run
from orchestration.resources import AiengResource


@dg.asset(
    key=raw.KIND,
    partitions_def=daily_partitions,
    backfill_policy=single_run,
    code_version=raw.CODE_VERSION,
    group_name="data",
    kinds={"jsonl", "csv", "parquet"},
    description=(
        "Immutable snapshot of the files landed in $AIENG_HOME/raw/YYYY-MM-DD/, with their SHA-256. A folder "
        "holding no data files is an empty day: zero files, no_data true."
    ),
)
def raw_documents(context: dg.AssetExecutionContext, aieng: AiengResource) -> dg.MaterializeResult:
    store, config = aieng.store(), aieng.settings()

    def describe(artifact: Artifact) -> dict:
        sources = artifact.manifest["sources"]
        return {
            "files": len(sources),
            "bytes": artifact.metrics["bytes"],
            "no_data": has_no_data(artifact),
            "landing_folder": artifact.metrics.get("landing_folder", LANDED),
            "sources": table(sources, ["path", "size", "sha256"]),
            "ignored_files": ", ".join(artifact.manifest.get("ignored_files", [])) or "none",
        }

    # Asked for alone, a day without a landing folder is refused (a mistyped date, most likely);
    # inside a range it is an empty day, so it cannot fail the days around it.
    absent_ok = len(context.partition_keys) > 1
    return materialize_partitions(
        context,
        lambda p: raw.build_raw_documents(store, config, p, run_info(context), context.log, absent_ok=absent_ok),
        describe,
    )


@dg.asset(
    key=clean.KIND,
    deps=[raw_documents],
    partitions_def=daily_partitions,
    backfill_policy=single_run,
    code_version=clean.CODE_VERSION,
    group_name="data",
    kinds={"parquet"},
    description=(
        "Rows that meet the data contract, cleaned (control characters, NFC, whitespace), within length "
        "bounds and de-duplicated; every other row is in quarantine.parquet with its reason."
    ),
)
def clean_documents(context: dg.AssetExecutionContext, aieng: AiengResource) -> dg.MaterializeResult:
    store, config = aieng.store(), aieng.settings()

    def describe(artifact: Artifact) -> dict:
        metrics = artifact.metrics
        return {
            "rows_expected": metrics["rows_expected"],
            "rows_in": metrics["rows_in"],
            "files": table(metrics["files"], ["name", "expected", "read", "count_source"]),
            "rows_clean": metrics["rows_clean"],
            "rows_quarantined": metrics["rows_quarantined"],
            "no_data": has_no_data(artifact),
            **{f"quarantined_{reason}": metrics["reasons"][reason] for reason in ALL_REASONS},
            "clean_sample": table(head(artifact.file(CLEAN_FILE), 5), ["id", "text", "source_file", "line"]),
            "quarantine_sample": table(
                quarantine_samples(artifact), ["reason", "detail", "source_file", "line", "raw"]
            ),
        }

    return materialize_partitions(
        context, lambda p: clean.build_clean_documents(store, config, p, run_info(context), context.log), describe
    )


@dg.asset_check(asset=raw_documents, blocking=True, description="Every snapshot file still matches its SHA-256.")
def raw_snapshot_intact(context: dg.AssetCheckExecutionContext, aieng: AiengResource) -> dg.AssetCheckResult:
    store, kind = aieng.store(), raw_documents.key.to_user_string()
    return verify_current(store, kind, run_partitions(context, store, kind))


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
        p: clean.row_accounting(store.require_current(clean.KIND, p))
        for p in run_partitions(context, store, clean.KIND)
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


CHECKS = [raw_snapshot_intact, rows_accounted_for]
