"""The whole code location loads, and its shape is the contract the docs promise
(docs/index.md, "The asset graph").

The data half (raw_documents ... dataset_manifest) is pinned exactly; assets beyond it must be
the next ones of the graph, in order, and follow the same rules.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import dagster as dg
import pytest

import aieng_core
from orchestration.definitions import defs
from tests.conftest import TINY_CONFIG
from tests.graph import ASSET_GRAPH

DATA_HALF = ASSET_GRAPH[:5]
PARTITIONED = {"raw_documents", "clean_documents", "tokenized_documents"}
DATA_HALF_PARENTS = {
    "raw_documents": set(),
    "clean_documents": {"raw_documents"},
    "bpe_tokenizer": {"clean_documents"},
    "tokenized_documents": {"clean_documents", "bpe_tokenizer"},
    "dataset_manifest": {"tokenized_documents", "bpe_tokenizer"},
}
DATA_HALF_CHECKS = {
    ("raw_documents", "raw_snapshot_intact"),
    ("clean_documents", "rows_accounted_for"),
    ("bpe_tokenizer", "tokenizer_round_trips"),
    ("bpe_tokenizer", "tokenizer_inputs_current"),
    ("tokenized_documents", "tokenized_matches_clean"),
    ("dataset_manifest", "dataset_manifest_intact"),
}


def core_code_versions() -> dict[str, str]:
    """KIND -> CODE_VERSION of every aieng_core module that builds an artifact kind."""
    root = Path(aieng_core.__file__).parent
    found: dict[str, str] = {}
    for path in sorted(root.rglob("*.py")):
        if not re.search(r"^KIND = ", path.read_text(encoding="utf-8"), re.MULTILINE):
            continue
        name = ".".join(("aieng_core", *path.relative_to(root).with_suffix("").parts))
        module = importlib.import_module(name)
        assert module.KIND not in found, f"two core modules build {module.KIND}"
        found[module.KIND] = module.CODE_VERSION
    return found


def asset_keys() -> list[str]:
    return sorted(key.to_user_string() for key in defs.resolve_asset_graph().get_all_asset_keys())


def test_code_location_is_loadable() -> None:
    dg.Definitions.validate_loadable(defs)


def test_asset_keys_follow_the_documented_graph() -> None:
    keys = set(asset_keys())
    assert set(DATA_HALF) <= keys, f"missing {sorted(set(DATA_HALF) - keys)}"
    # No asset outside the documented graph (issues add them in their own order: serving_bundle
    # came before benchmark_report, which is then inserted between the model and the bundle).
    assert keys <= set(ASSET_GRAPH), sorted(keys - set(ASSET_GRAPH))


def test_asset_graph_edges() -> None:
    graph = defs.resolve_asset_graph()
    parents = {key: {p.to_user_string() for p in graph.get(dg.AssetKey(key)).parent_keys} for key in asset_keys()}
    assert {key: parents[key] for key in DATA_HALF} == DATA_HALF_PARENTS
    for key, upstream in parents.items():
        assert upstream <= set(parents), f"{key} depends on assets outside the location: {upstream - set(parents)}"
        if key not in DATA_HALF:
            assert upstream, f"{key} has no upstream"


def test_every_asset_code_version_is_its_core_modules_code_version() -> None:
    versions = core_code_versions()
    assert set(DATA_HALF) <= set(versions)
    graph = defs.resolve_asset_graph()
    for key in asset_keys():
        assert key in versions, f"no aieng_core module declares KIND = {key!r}"
        assert versions[key], key  # never empty: staleness and artifact ids depend on it
        assert graph.get(dg.AssetKey(key)).code_version == versions[key], key


def test_data_half_code_versions_pinned_to_their_modules() -> None:
    from aieng_core.data import clean_documents, raw_documents
    from aieng_core.dataset import dataset_manifest
    from aieng_core.tokenizer import bpe_tokenizer, tokenized_documents

    graph = defs.resolve_asset_graph()
    for module in (raw_documents, clean_documents, bpe_tokenizer, tokenized_documents, dataset_manifest):
        assert graph.get(dg.AssetKey(module.KIND)).code_version == module.CODE_VERSION


def test_partitioning_and_backfill_policy() -> None:
    graph = defs.resolve_asset_graph()
    for key in asset_keys():
        node = graph.get(dg.AssetKey(key))
        # `dagster asset materialize --select '*' --partition-range A...B` needs single_run on
        # every selected asset, partitioned or not.
        assert node.backfill_policy == dg.BackfillPolicy.single_run(), key
        if key in PARTITIONED:
            assert isinstance(node.partitions_def, dg.DailyPartitionsDefinition), key
            assert node.partitions_def.get_first_partition_key() == "2026-01-01"
        else:
            assert node.partitions_def is None, key


def test_whole_partition_history_feeds_the_unpartitioned_assets() -> None:
    graph = defs.resolve_asset_graph()
    tokenizer = graph.get(dg.AssetKey("bpe_tokenizer"))
    manifest = graph.get(dg.AssetKey("dataset_manifest"))
    assert isinstance(tokenizer.partition_mappings[dg.AssetKey("clean_documents")], dg.AllPartitionMapping)
    assert isinstance(manifest.partition_mappings[dg.AssetKey("tokenized_documents")], dg.AllPartitionMapping)


def test_checks_exist_and_are_blocking() -> None:
    specs = [spec for checks_def in defs.asset_checks for spec in checks_def.check_specs]
    declared = {(spec.asset_key.to_user_string(), spec.name) for spec in specs}
    assert DATA_HALF_CHECKS <= declared, f"missing {sorted(DATA_HALF_CHECKS - declared)}"
    assert {
        (spec.asset_key.to_user_string(), spec.name) for spec in specs if spec.asset_key.to_user_string() in DATA_HALF
    } == DATA_HALF_CHECKS
    # Checks stop bad data from flowing on; rollback_target_ready guards no downstream step (it
    # reports whether a rollback would work), and tokenizer_inputs_current warns of a retrain that
    # would change every token id (a decision, not a repair): they alone do not block.
    assert sorted(spec.name for spec in specs if not spec.blocking) == [
        "rollback_target_ready",
        "tokenizer_inputs_current",
    ]
    assert ("production_deployment", "rollback_target_ready") in declared
    assert all(asset in asset_keys() for asset, _ in declared)
    graph_checks = {(key.asset_key.to_user_string(), key.name) for key in defs.resolve_asset_graph().asset_check_keys}
    assert graph_checks == declared


def test_daily_ingest_job_is_the_data_half_with_its_checks() -> None:
    job = defs.resolve_job_def("daily_ingest")
    assert isinstance(job.partitions_def, dg.DailyPartitionsDefinition)
    assert {key.to_user_string() for key in job.asset_layer.selected_asset_keys} == set(DATA_HALF)
    # The job runs every check of its assets (their op names are <asset>_<check>).
    nodes = {node.name for node in job.graph.node_defs}
    assert nodes == set(DATA_HALF) | {f"{asset}_{check}" for asset, check in DATA_HALF_CHECKS}


def test_daily_ingest_schedule() -> None:
    assert [s.name for s in defs.schedules or []] == [
        "daily_ingest_schedule",
        "retrain_schedule",
        "rollback_readiness_schedule",
    ]
    schedule = defs.resolve_schedule_def("daily_ingest_schedule")
    assert schedule.job_name == "daily_ingest"
    assert schedule.cron_schedule == "0 1 * * *"
    assert schedule.execution_timezone in (None, "UTC")


def test_jobs_and_sensors() -> None:
    assert sorted(job.name for job in defs.jobs or []) == [
        "daily_ingest",
        "deploy",
        "retrain",
        "rollback_readiness",
        "train",
    ]
    assert [sensor.name for sensor in defs.sensors or []] == [
        "landing_sensor",
        "retrain_sensor",
        "retrain_chain_automation",
        "serving_bundle_sensor",
        "deployment_pointer_sensor",
    ]
    statuses = {sensor.name: sensor.default_status for sensor in defs.sensors or []}
    # The pointer sensor only records what the pointer says, so it runs from the start; the
    # ones that launch ingest and gate runs wait to be turned on.
    assert statuses == {
        "landing_sensor": dg.DefaultSensorStatus.STOPPED,
        "retrain_sensor": dg.DefaultSensorStatus.STOPPED,
        "retrain_chain_automation": dg.DefaultSensorStatus.STOPPED,
        "serving_bundle_sensor": dg.DefaultSensorStatus.STOPPED,
        "deployment_pointer_sensor": dg.DefaultSensorStatus.RUNNING,
    }
    readiness = defs.resolve_job_def("rollback_readiness")
    assert {node.name for node in readiness.graph.node_defs} == {"production_deployment_rollback_target_ready"}
    # A gate run checks the rollback target it leaves behind.
    deploy = defs.resolve_job_def("deploy")
    assert {node.name for node in deploy.graph.node_defs} == {
        "production_deployment",
        "production_deployment_rollback_target_ready",
    }


def test_resource_defaults_follow_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from orchestration.partitions import CONFIG_PATH
    from orchestration.resources import AiengResource

    resource = defs.resources["aieng"]
    assert isinstance(resource, AiengResource)
    # One config file: the one the code location loaded (tests/conftest.py makes it tiny.yaml).
    assert resource.home is None and resource.config_path == str(CONFIG_PATH) == str(TINY_CONFIG)
    monkeypatch.setenv("AIENG_HOME", str(tmp_path / "somewhere"))
    assert resource.store().home == (tmp_path / "somewhere").resolve()
    assert resource.settings().tokenizer.vocab_size == 512  # configs/tiny.yaml
    assert AiengResource().settings().tokenizer.vocab_size == 512  # the default is the same file


def test_a_resource_config_that_disagrees_about_start_date_is_refused(tmp_path: Path) -> None:
    from aieng_core.config import ConfigError
    from orchestration.resources import AiengResource

    other = tmp_path / "other.yaml"
    other.write_text(TINY_CONFIG.read_text(encoding="utf-8").replace('"2026-01-01"', '"2026-02-01"'), encoding="utf-8")
    with pytest.raises(ConfigError) as refused:
        AiengResource(config_path=str(other)).settings()
    assert str(refused.value).startswith(
        f"{other}: data.start_date is 2026-02-01, but the code location's daily partitions start at 2026-01-01 "
        f"(data.start_date of {TINY_CONFIG}, read when it loaded)"
    )


def test_runs_in_process() -> None:
    assert defs.executor is dg.in_process_executor


def test_loading_the_code_location_imports_no_torch_transformers_or_matplotlib() -> None:
    """Every `dagster asset materialize` loads the code location; a data asset must not pay
    for importing the model stack (about 2 s of each run before this was lazy)."""
    import subprocess
    import sys

    script = (
        "import sys, orchestration.definitions; "
        "print(sorted(m for m in ('torch', 'transformers', 'matplotlib') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "[]"
