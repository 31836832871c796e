"""Shared helpers of the orchestration tests: the asset list, resources, record look-ups."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dagster as dg

from aieng_core.data.demo_data import EXPECTED_DIRTY, GBK_CSV_TEXTS, day_documents
from aieng_core.data.reasons import ALL_REASONS
from orchestration.assets.data import clean_documents, raw_documents
from orchestration.assets.dataset import dataset_manifest
from orchestration.assets.tokenizer import bpe_tokenizer, tokenized_documents
from orchestration.definitions import ALL_CHECKS
from orchestration.resources import AiengResource
from tests.conftest import DEMO_PARTITIONS, TINY_CONFIG

ASSET_DEFS = [raw_documents, clean_documents, bpe_tokenizer, tokenized_documents, dataset_manifest]
_DATA_HALF_KEYS = {asset.key for asset in ASSET_DEFS}
# The data half and its checks only: checks of later assets (model_checkpoint, ...) stay out.
ASSETS = [*ASSET_DEFS, *(c for c in ALL_CHECKS if all(spec.asset_key in _DATA_HALF_KEYS for spec in c.check_specs))]
PARTITIONED_KEYS = ["raw_documents", "clean_documents", "tokenized_documents"]
CHECK_NAMES = {
    "raw_snapshot_intact",
    "rows_accounted_for",
    "tokenizer_round_trips",
    "tokenizer_inputs_current",
    "tokenized_matches_clean",
    "dataset_manifest_intact",
}
# Clean rows the demo generator adds beside the corpus documents of each day: day 1 hides a
# GBK line in its JSONL file, day 2 lands a GBK-encoded CSV of Chinese texts.
_CLEAN_EXTRAS = {0: 1, 1: len(GBK_CSV_TEXTS), 2: 0}


def resources(home: Path) -> dict[str, Any]:
    return {"aieng": AiengResource(home=str(home), config_path=str(TINY_CONFIG))}


def range_tags(start: str, end: str) -> dict[str, str]:
    return {"dagster/asset_partition_range_start": start, "dagster/asset_partition_range_end": end}


ALL_DEMO_DAYS = range_tags(DEMO_PARTITIONS[0], DEMO_PARTITIONS[-1])


def expected_counts(partition: str) -> dict[str, Any]:
    """What clean_documents must report for a demo partition, derived from the generator."""
    index = DEMO_PARTITIONS.index(partition)
    dirty = EXPECTED_DIRTY[f"day{index + 1}"]
    rows_clean = len(day_documents(index)) + _CLEAN_EXTRAS[index]
    rows_quarantined = sum(dirty.values())
    return {
        "rows_in": rows_clean + rows_quarantined,
        "rows_clean": rows_clean,
        "rows_quarantined": rows_quarantined,
        "reasons": {reason: dirty.get(reason, 0) for reason in ALL_REASONS},
    }


def latest(instance: dg.DagsterInstance, key: str, partition: str | None = None) -> dg.AssetMaterialization:
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey(key), asset_partitions=[partition] if partition else None), limit=1
    ).records
    assert records, f"no materialization of {key} {partition or ''}"
    return records[0].asset_materialization


def materializations(
    instance: dg.DagsterInstance, key: str, partition: str | None = None
) -> list[dg.AssetMaterialization]:
    """Every materialization of an asset (partition), oldest first."""
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey(key), asset_partitions=[partition] if partition else None),
        limit=1000,
        ascending=True,
    ).records
    return [record.asset_materialization for record in records]


def meta(materialization: dg.AssetMaterialization) -> dict[str, Any]:
    """Metadata values, unwrapped."""
    return {key: value.value for key, value in materialization.metadata.items()}


def run_materializations(result: dg.ExecuteInProcessResult) -> dict[tuple[str, str | None], dg.AssetMaterialization]:
    """(asset key, partition) -> materialization, for one run."""
    found = {}
    for event in result.get_asset_materialization_events():
        materialization = event.event_specific_data.materialization
        found[(materialization.asset_key.to_user_string(), materialization.partition)] = materialization
    return found


def check_outcomes(result: dg.ExecuteInProcessResult) -> dict[str, bool]:
    return {evaluation.check_name: evaluation.passed for evaluation in result.get_asset_check_evaluations()}


def step_failure_messages(result: dg.ExecuteInProcessResult) -> dict[str, str]:
    """step key -> the failure's messages, causes included."""
    found = {}
    for event in result.get_step_failure_events():
        error = event.step_failure_data.error
        parts = []
        while error is not None:
            parts.append(error.message)
            error = error.cause
        found[event.step_key] = "\n".join(parts)
    return found


def started_steps(result: dg.ExecuteInProcessResult) -> set[str]:
    return {event.step_key for event in result.all_events if event.event_type_value == "STEP_START"}


def tick_like_the_daemon(
    sensor: dg.SensorDefinition, instance: dg.DagsterInstance, cursor: str | None, resources: dict[str, Any]
) -> Any:
    """One evaluation of `sensor`, its asset events then recorded in `instance` as the daemon
    records them (dagster/_daemon/sensor.py: `instance.report_runless_asset_event` for each)."""
    data = sensor.evaluate_tick(dg.build_sensor_context(instance=instance, cursor=cursor, resources=resources))
    for event in data.asset_events:
        instance.report_runless_asset_event(event)
    return data


def flip_a_byte(path: Path) -> None:
    """Change one byte in the middle of a file (a damaged artifact file)."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


# benchmark_report's first metadata rows with configs/tiny.yaml (batch sizes 1 and 4,
# concurrencies 1 and 4): quality, then speed, then the inline charts.
TINY_BENCHMARK_HEADLINES = [
    "validation_loss",
    "validation_bits_per_byte",
    "tokens_per_second_batch_1",
    "tokens_per_second_batch_4",
    "ttft_p99_ms_concurrency_1",
    "ttft_p99_ms_concurrency_4",
    "throughput_chart",
    "ttft_p99_chart",
]
