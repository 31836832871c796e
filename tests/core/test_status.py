"""`aieng data status`: the current artifact of every asset, the serving bundle included."""

from __future__ import annotations

import datetime as dt
import json
import shutil
from pathlib import Path

from aieng_core.status import format_status, pipeline_status
from aieng_core.store import ArtifactStore

START = dt.date(2026, 1, 1)  # data.start_date of the test configs


def test_status_names_every_asset_down_to_the_serving_bundle(serving_bundle_artifact) -> None:
    status = pipeline_status(serving_bundle_artifact.store, START)
    assets = status["assets"]
    assert assets["model_checkpoint"]["id"] == serving_bundle_artifact.model.id
    assert assets["serving_bundle"]["id"] == serving_bundle_artifact.bundle.id
    assert sorted(assets["clean_documents"]) == ["2026-01-01", "2026-01-02", "2026-01-03"]
    report = serving_bundle_artifact.store.require_current("benchmark_report")
    assert (
        assets["benchmark_report"]["id"] == report.id == serving_bundle_artifact.bundle.metrics["benchmark_report_id"]
    )
    text = format_status(status)
    assert f"serving_bundle: {serving_bundle_artifact.bundle.id}" in text
    m = report.metrics
    assert (
        f"benchmark_report: {report.id}  (model_checkpoint {serving_bundle_artifact.model.id}), validation loss "
        f"{m['validation_loss']:.3f} vs unigram {m['unigram_baseline_loss']:.3f}, "
        f"{m['tokens_per_second_batch_4']:,.0f} tok/s at batch 4 "
        f"({m['ratio_vs_transformers_batch_4']:.2f}x transformers)"
    ) in text.splitlines()
    assert "TRUNCATED" not in text
    assert "PARTIAL" not in text
    json.dumps(status)  # the --json form is one JSON document


def test_status_flags_a_partial_model(serving_bundle_artifact, tmp_path: Path) -> None:
    home = tmp_path / "home"
    shutil.copytree(serving_bundle_artifact.home, home)
    store = ArtifactStore(home)
    model = store.require_current("model_checkpoint")
    manifest = dict(model.manifest)
    manifest["metrics"] = {**manifest["metrics"], "partial": True, "stopped_by": "max_minutes", "steps": 40}
    (model.path / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    text = format_status(pipeline_status(store, START))
    assert "PARTIAL: stopped by max_minutes after 40 of 150 steps" in text
