"""The whole code location loads, and its shape is the contract DESIGN.md promises."""

from __future__ import annotations

import dagster as dg
import pytest

from aieng_core.data import clean_documents, raw_documents
from aieng_core.dataset import dataset_manifest
from aieng_core.tokenizer import bpe_tokenizer, tokenized_documents
from orchestration.definitions import defs

CORE_MODULES = {
    "raw_documents": raw_documents,
    "clean_documents": clean_documents,
    "bpe_tokenizer": bpe_tokenizer,
    "tokenized_documents": tokenized_documents,
    "dataset_manifest": dataset_manifest,
}
PARTITIONED = {"raw_documents", "clean_documents", "tokenized_documents"}
EXPECTED_CHECKS = {
    ("raw_documents", "raw_snapshot_intact"),
    ("clean_documents", "rows_accounted_for"),
    ("bpe_tokenizer", "tokenizer_round_trips"),
    ("tokenized_documents", "tokenized_matches_clean"),
    ("dataset_manifest", "dataset_manifest_intact"),
}


def test_code_location_is_loadable() -> None:
    dg.Definitions.validate_loadable(defs)


def test_asset_keys_are_exactly_the_data_half_of_the_graph() -> None:
    graph = defs.resolve_asset_graph()
    assert {key.to_user_string() for key in graph.get_all_asset_keys()} == set(CORE_MODULES)


def test_asset_graph_edges() -> None:
    graph = defs.resolve_asset_graph()
    parents = {
        key.to_user_string(): {parent.to_user_string() for parent in graph.get(key).parent_keys}
        for key in graph.get_all_asset_keys()
    }
    assert parents == {
        "raw_documents": set(),
        "clean_documents": {"raw_documents"},
        "bpe_tokenizer": {"clean_documents"},
        "tokenized_documents": {"clean_documents", "bpe_tokenizer"},
        "dataset_manifest": {"tokenized_documents", "bpe_tokenizer"},
    }


@pytest.mark.parametrize("key", sorted(CORE_MODULES))
def test_code_version_is_the_core_modules_code_version(key: str) -> None:
    node = defs.resolve_asset_graph().get(dg.AssetKey(key))
    module = CORE_MODULES[key]
    assert module.KIND == key
    assert node.code_version == module.CODE_VERSION
    assert node.code_version  # never empty: staleness and artifact ids depend on it


@pytest.mark.parametrize("key", sorted(CORE_MODULES))
def test_partitioning_and_backfill_policy(key: str) -> None:
    node = defs.resolve_asset_graph().get(dg.AssetKey(key))
    # `dagster asset materialize --select '*' --partition-range A...B` needs single_run on
    # every selected asset, partitioned or not.
    assert node.backfill_policy == dg.BackfillPolicy.single_run()
    if key in PARTITIONED:
        assert isinstance(node.partitions_def, dg.DailyPartitionsDefinition)
        assert node.partitions_def.get_first_partition_key() == "2026-01-01"
    else:
        assert node.partitions_def is None


def test_whole_tokenized_history_feeds_the_unpartitioned_assets() -> None:
    graph = defs.resolve_asset_graph()
    tokenizer = graph.get(dg.AssetKey("bpe_tokenizer"))
    manifest = graph.get(dg.AssetKey("dataset_manifest"))
    assert isinstance(tokenizer.partition_mappings[dg.AssetKey("clean_documents")], dg.AllPartitionMapping)
    assert isinstance(manifest.partition_mappings[dg.AssetKey("tokenized_documents")], dg.AllPartitionMapping)


def test_checks_exist_and_are_blocking() -> None:
    specs = [spec for checks_def in defs.asset_checks for spec in checks_def.check_specs]
    assert {(spec.asset_key.to_user_string(), spec.name) for spec in specs} == EXPECTED_CHECKS
    assert all(spec.blocking for spec in specs), [spec.name for spec in specs if not spec.blocking]
    graph_checks = {(key.asset_key.to_user_string(), key.name) for key in defs.resolve_asset_graph().asset_check_keys}
    assert graph_checks == EXPECTED_CHECKS


def test_daily_ingest_job_and_schedule() -> None:
    job = defs.resolve_job_def("daily_ingest")
    assert isinstance(job.partitions_def, dg.DailyPartitionsDefinition)
    assert {key.to_user_string() for key in job.asset_layer.selected_asset_keys} == set(CORE_MODULES)
    # The job runs every check of its assets (their op names are <asset>_<check>).
    nodes = {node.name for node in job.graph.node_defs}
    assert nodes == set(CORE_MODULES) | {f"{asset}_{check}" for asset, check in EXPECTED_CHECKS}

    schedules = list(defs.schedules or [])
    assert [s.name for s in schedules] == ["daily_ingest_schedule"]
    schedule = defs.resolve_schedule_def("daily_ingest_schedule")
    assert schedule.job_name == "daily_ingest"
    assert schedule.cron_schedule == "0 1 * * *"
    assert schedule.execution_timezone in (None, "UTC")


def test_resource_defaults_follow_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    from orchestration.resources import AiengResource

    resource = defs.resources["aieng"]
    assert isinstance(resource, AiengResource)
    assert resource.home is None and resource.config_path is None
    monkeypatch.setenv("AIENG_HOME", str(tmp_path / "somewhere"))
    assert resource.store().home == (tmp_path / "somewhere").resolve()
    assert resource.settings().tokenizer.vocab_size == 512  # configs/tiny.yaml, from AIENG_CONFIG


def test_runs_in_process() -> None:
    assert defs.executor is dg.in_process_executor
