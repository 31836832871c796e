"""What the asset checks share. Blocking checks stop downstream steps of the same run. A
check of a partitioned asset looks at the partitions of its run (all present ones when run on
its own), reading the artifacts themselves rather than trusting metadata."""

import dagster as dg

from aieng_core.store import ArtifactStore
from orchestration.partitions import daily_partitions


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


def verify_current(store: ArtifactStore, kind: str, partitions: list[str | None]) -> dg.AssetCheckResult:
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
