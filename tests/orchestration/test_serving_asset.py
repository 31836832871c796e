"""serving_bundle and its blocking check bundle_verified, materialized by Dagster.

The trained tiny home with its benchmark report (tests/bundle_fixtures.py) is copied, then
model_checkpoint (reused) and serving_bundle are materialized with a real instance; the check is then shown to fail
on a bundle whose golden output no longer replays, and on a damaged bundle file.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import pytest

from aieng_core.bundle import serving_bundle as bundle_core
from aieng_core.bundle.verify import verify_bundle
from aieng_core.hashing import sha256_file
from aieng_core.store import ArtifactStore
from aieng_core.store.artifacts import MANIFEST
from orchestration.assets.benchmark import benchmark_report
from orchestration.assets.model import model_checkpoint
from orchestration.assets.serving import bundle_verified, golden_table, serving_bundle
from orchestration.resources import AiengResource
from tests.conftest import TINY_CONFIG
from tests.orchestration.helpers import check_outcomes, meta, run_materializations

GRAPH = [model_checkpoint, benchmark_report, serving_bundle, bundle_verified]
SELECTION = dg.AssetSelection.assets(serving_bundle) | dg.AssetSelection.checks(bundle_verified)


@dataclass
class Materialized:
    home: Path
    first: dg.ExecuteInProcessResult
    again: dg.ExecuteInProcessResult

    @property
    def store(self) -> ArtifactStore:
        return ArtifactStore(self.home)


def aieng(home: Path) -> dict[str, AiengResource]:
    return {"aieng": AiengResource(home=str(home), config_path=str(TINY_CONFIG))}


@pytest.fixture(scope="module")
def bundled(
    trained_home, benchmark_report_artifact, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Materialized]:
    home = tmp_path_factory.mktemp("serving-graph") / "aieng-home"
    shutil.copytree(trained_home.home, home)
    # Another test may have bundled the shared home already: this run must build its own (from the
    # session's benchmark report, current in the home: the report is materialized elsewhere).
    shutil.rmtree(home / "artifacts" / "serving_bundle", ignore_errors=True)
    shutil.rmtree(home / "refs" / "serving_bundle", ignore_errors=True)
    with dg.instance_for_test() as instance:
        first = dg.materialize(GRAPH, instance=instance, resources=aieng(home), selection=SELECTION)
        again = dg.materialize(GRAPH, instance=instance, resources=aieng(home), selection=SELECTION)
        yield Materialized(home, first, again)


def bundle_materialization(result: dg.ExecuteInProcessResult) -> dg.AssetMaterialization:
    return run_materializations(result)[("serving_bundle", None)]


def test_the_bundle_is_materialized_and_verified(
    bundled: Materialized, trained_home, benchmark_report_artifact
) -> None:
    for result in (bundled.first, bundled.again):
        assert result.success
        assert check_outcomes(result) == {"bundle_verified": True}
        assert set(run_materializations(result)) == {("serving_bundle", None)}
    bundle = bundled.store.require_current("serving_bundle")
    assert bundle.manifest["inputs"] == [
        {"kind": "model_checkpoint", "id": trained_home.model.id},
        {"kind": "benchmark_report", "id": benchmark_report_artifact.id},
    ]
    assert bundle.manifest["dagster_run_id"] == bundled.first.run_id


def test_metadata_shows_the_artifact_goldens_and_limits(bundled: Materialized) -> None:
    bundle = bundled.store.require_current("serving_bundle")
    values = meta(bundle_materialization(bundled.first))
    golden = json.loads(bundle.file(bundle_core.GOLDEN_FILE).read_text(encoding="utf-8"))
    assert values["artifact_id"] == bundle.id
    assert values["content_sha256"] == bundle.content_sha256
    assert values["reused"] is False
    assert values["input_ids"] == f"{bundle.metrics['model_checkpoint_id']}, {bundle.metrics['benchmark_report_id']}"
    for name in ("model_checkpoint_id", "parameters", "files", "bytes", "kv_cache_bytes", "golden_prompts"):
        assert values[name] == bundle.metrics[name], name
    assert values["golden_outputs"] == golden_table(golden["outputs"])
    assert values["serving_limits"] == json.loads(bundle.file(bundle_core.SERVING_FILE).read_text(encoding="utf-8"))
    assert values["lineage"] == bundle.manifest["lineage"]
    assert values["serve_command"] == f"aieng serve --bundle {bundle.path}"
    assert bundle_materialization(bundled.first).tags["dagster/data_version"] == bundle.content_sha256
    again = meta(bundle_materialization(bundled.again))
    assert (again["reused"], again["artifact_id"]) == (True, bundle.id)


def test_golden_table_lists_every_prompt() -> None:
    table = golden_table(
        [
            {"prompt": "a|b", "token_ids": [1, 2], "text": "x\ny", "finish_reason": "length"},
            {"prompt": "数据", "token_ids": [0], "text": "", "finish_reason": "stop"},
        ]
    )
    assert table.splitlines() == [
        "| prompt | tokens | greedy continuation | finish |",
        "|---|---|---|---|",
        "| a\\|b | 2 | x\\ny | length |",
        "| 数据 | 1 |  | stop |",
    ]


def test_check_metadata(bundled: Materialized) -> None:
    [evaluation] = bundled.first.get_asset_check_evaluations()
    values = {key: value.value for key, value in evaluation.metadata.items()}
    bundle = bundled.store.require_current("serving_bundle")
    assert values == {
        "bundle_id": bundle.id,
        "files_checked": len(bundle_core.BUNDLE_FILES) + 1,  # and benchmark.json
        "goldens_replayed": 5,
        "goldens_matching": 5,
        "problems": [],
    }


def _copied(bundled: Materialized, tmp_path: Path) -> tuple[Path, Path]:
    home = tmp_path / "aieng-home"
    shutil.copytree(bundled.home, home)
    return home, ArtifactStore(home).require_current("serving_bundle").path


def test_the_check_fails_when_a_golden_no_longer_replays(bundled: Materialized, tmp_path: Path) -> None:
    home, path = _copied(bundled, tmp_path)
    doc = json.loads((path / bundle_core.GOLDEN_FILE).read_text(encoding="utf-8"))
    doc["outputs"][2]["token_ids"][0] += 1
    (path / bundle_core.GOLDEN_FILE).write_text(json.dumps(doc), encoding="utf-8")
    manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    manifest["files"][bundle_core.GOLDEN_FILE] = sha256_file(path / bundle_core.GOLDEN_FILE)
    manifest["content_sha256"] = bundle_core.bundle_content_sha256(
        {name: manifest["files"][name] for name in bundle_core.BUNDLE_FILES}
    )
    (path / MANIFEST).write_text(json.dumps(manifest), encoding="utf-8")
    result = bundle_verified(aieng=aieng(home)["aieng"])
    assert result.passed is False
    problems = verify_bundle(path)["problems"]
    assert len(problems) == 1 and "golden prompt 'A model' differs from token 0" in problems[0]
    values = {key: value.value for key, value in result.metadata.items()}
    assert (values["goldens_replayed"], values["goldens_matching"], values["problems"]) == (5, 4, problems)
    assert result.description == problems[0]


def test_the_check_in_a_run_fails_on_a_damaged_bundle(bundled: Materialized, tmp_path: Path) -> None:
    home, path = _copied(bundled, tmp_path)
    tokenizer = path / "tokenizer.json"
    tokenizer.write_bytes(tokenizer.read_bytes() + b" ")
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            GRAPH,
            instance=instance,
            resources=aieng(home),
            selection=dg.AssetSelection.checks(bundle_verified),
            raise_on_error=False,
        )
    assert check_outcomes(result) == {"bundle_verified": False}
    [evaluation] = result.get_asset_check_evaluations()
    problems = evaluation.metadata["problems"].value
    assert problems == [f"{tokenizer}: sha256 does not match the manifest"]
