"""bundle.weights: int8 through Dagster: serving_bundle materializes the int8 variant, and its
blocking check int8_within_quality_margin passes it, or refuses a quantization that costs too
much; on a float32 bundle the check passes with nothing to compare."""

from __future__ import annotations

import shutil
from pathlib import Path

import dagster as dg
import pytest
import yaml

from aieng_core.model import int8_weights
from aieng_core.store import ArtifactStore
from orchestration.assets.benchmark import benchmark_report
from orchestration.assets.model import model_checkpoint
from orchestration.assets.serving import bundle_verified, int8_within_quality_margin, serving_bundle
from orchestration.resources import AiengResource
from tests.conftest import TINY_CONFIG
from tests.orchestration.helpers import check_outcomes, meta, run_materializations

GRAPH = [model_checkpoint, benchmark_report, serving_bundle, bundle_verified, int8_within_quality_margin]
SELECTION = dg.AssetSelection.assets(benchmark_report, serving_bundle) | dg.AssetSelection.checks(
    bundle_verified, int8_within_quality_margin
)


def int8_home(trained_home, tmp_path: Path) -> tuple[Path, Path]:
    home = tmp_path / "aieng-home"
    shutil.copytree(trained_home.home, home)
    shutil.rmtree(home / "artifacts" / "serving_bundle", ignore_errors=True)
    shutil.rmtree(home / "refs" / "serving_bundle", ignore_errors=True)
    ArtifactStore(home).set_current(trained_home.model)
    values = yaml.safe_load(TINY_CONFIG.read_text(encoding="utf-8"))
    values["bundle"]["weights"] = "int8"
    config = tmp_path / "int8.yaml"
    config.write_text(yaml.safe_dump(values), encoding="utf-8")
    return home, config


def materialize(home: Path, config: Path) -> dg.ExecuteInProcessResult:
    resources = {"aieng": AiengResource(home=str(home), config_path=str(config))}
    with dg.instance_for_test() as instance:
        return dg.materialize(GRAPH, instance=instance, resources=resources, selection=SELECTION, raise_on_error=False)


def check_values(result: dg.ExecuteInProcessResult, name: str) -> dict:
    [evaluation] = [e for e in result.get_asset_check_evaluations() if e.check_name == name]
    return {key: value.value for key, value in evaluation.metadata.items()} | {"description": evaluation.description}


def test_the_int8_variant_is_materialized_and_passes_its_check(trained_home, tmp_path: Path) -> None:
    home, config = int8_home(trained_home, tmp_path)
    result = materialize(home, config)
    assert result.success
    assert check_outcomes(result) == {"bundle_verified": True, "int8_within_quality_margin": True}
    bundle = ArtifactStore(home).require_current("serving_bundle")
    values = meta(run_materializations(result)[("serving_bundle", None)])
    assert (values["artifact_id"], values["weights"]) == (bundle.id, "int8")
    assert values["source_bundle_id"] == bundle.metrics["source_bundle_id"]
    assert values["golden_agreement"] == bundle.metrics["golden_agreement"]
    checked = check_values(result, "int8_within_quality_margin")
    quality = bundle.metrics["int8_quality"]
    assert (checked["bundle_id"], checked["source_bundle_id"]) == (bundle.id, bundle.metrics["source_bundle_id"])
    assert (checked["fp32_bits_per_byte"], checked["int8_bits_per_byte"]) == (
        quality["fp32_bits_per_byte"],
        quality["int8_bits_per_byte"],
    )
    assert checked["margin"] == 0.01 and checked["description"] is None


def test_a_quantization_beyond_the_margin_fails_the_blocking_check(
    trained_home, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    honest = int8_weights.quantize_rows
    monkeypatch.setattr(int8_weights, "quantize_rows", lambda w: (honest(w)[0], honest(w)[1] * 0.5))
    home, config = int8_home(trained_home, tmp_path)
    result = materialize(home, config)
    assert check_outcomes(result) == {"bundle_verified": True, "int8_within_quality_margin": False}
    checked = check_values(result, "int8_within_quality_margin")
    assert checked["worse_by"] > 0.01
    assert checked["description"].startswith("the int8 variant's ")
    assert "gate.int8_max_quality_regression allows 1.00%" in checked["description"]


def test_a_float32_bundle_passes_with_nothing_quantized(trained_home, tmp_path: Path) -> None:
    home, _ = int8_home(trained_home, tmp_path)
    result = materialize(home, TINY_CONFIG)
    assert check_outcomes(result) == {"bundle_verified": True, "int8_within_quality_margin": True}
    checked = check_values(result, "int8_within_quality_margin")
    assert checked["description"] == "a float32 bundle: nothing quantized"
    assert meta(run_materializations(result)[("serving_bundle", None)])["weights"] == "fp32"
