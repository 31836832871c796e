"""The asset pages on-call opens, rendered by the real Dagster UI in headless Chromium.

model_checkpoint, benchmark_report and serving_bundle are materialized twice (reused: the
session's tiny home, copied) into a SQLite instance made from configs/dagster.yaml as shipped;
production_deployment gets a runless materialization made by `promoted_metadata`, the function
the gate asset writes its metadata with, from a gate report of a second promotion (a gate run
costs minutes: tests/orchestration/test_deployment_asset.py runs the real one). A
dagster-webserver serves the instance; each asset's overview page is loaded and screenshotted
(the paths are printed; AIENG_UI_SHOTS=DIR copies them there), and the page itself is read
back: the on-call figures are the first rows of its metadata table, on the first screen and
not cut at its edge, the inline charts are drawn, the numbers plot, and no onboarding dialog
covers any of it.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import yaml
from dagster_graphql import DagsterGraphQLClient
from playwright.sync_api import Page, sync_playwright

from orchestration.assets.benchmark import benchmark_report
from orchestration.assets.deployment import production_deployment, promoted_metadata
from orchestration.assets.model import model_checkpoint
from orchestration.assets.serving import serving_bundle
from orchestration.definitions import ALL_CHECKS
from orchestration.resources import AiengResource
from tests.bundle_fixtures import BundledHome
from tests.e2e.test_dagster_dev import (
    CHROMIUM_ARGS,
    PAGE_TIMEOUT_S,
    REPO_ROOT,
    TINY_CONFIG,
    dagster_in_own_group,
    wait_until_loaded,
)
from tests.e2e.ui_pages import DEPLOYED, METADATA_ROWS, READ_ROWS, SHOW_NUX, gate_report
from tests.orchestration.helpers import TINY_BENCHMARK_HEADLINES

pytestmark = pytest.mark.e2e

# 1600 px wide, as a laptop's browser; tall, so that one screenshot holds the on-call rows and
# the gate's tables below them (what a 1000 px window shows first is asserted from positions).
VIEWPORT = {"width": 1600, "height": 2600}
HEADLINES = {
    "model_checkpoint": [
        "validation_loss",
        "validation_bits_per_byte",
        "unigram_baseline_loss",
        "unigram_baseline_bits_per_byte",
        "training",
    ],
    "benchmark_report": TINY_BENCHMARK_HEADLINES,
    "serving_bundle": ["bundle_id", "validation_loss", "validation_bits_per_byte", "tokens_per_second_batch_1"],
    "production_deployment": ["verdict", "bundle_id", "bits_per_byte_candidate", "bits_per_byte_deployed"],
}
ONBOARDING_TEXT = "Join the Dagster community"  # the heading of the UI's first-visit dialog


@dataclass
class Served:
    port: int
    shots: Path
    metadata: dict[str, dict[str, Any]]  # asset key -> its latest materialization's values


def latest_metadata(instance: dg.DagsterInstance, key: str) -> dict[str, Any]:
    records = instance.fetch_materializations(dg.AssetKey(key), limit=1).records
    assert records, f"no materialization of {key}"
    return {name: value.value for name, value in records[0].asset_materialization.metadata.items()}


@pytest.fixture(scope="module")
def served(serving_bundle_artifact: BundledHome, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("dagster-ui").resolve()
    home, dagster_home, log = root / "aieng-home", root / "dagster-home", root / "webserver.log"
    shutil.copytree(serving_bundle_artifact.home, home)
    dagster_home.mkdir()
    (root / "tmp").mkdir()
    shutil.copy(REPO_ROOT / "configs" / "dagster.yaml", dagster_home / "dagster.yaml")
    # As shipped, the instance turns the onboarding dialog off (else it covers every first visit).
    assert yaml.safe_load((dagster_home / "dagster.yaml").read_text())["nux"] == {"enabled": False}
    resources = {"aieng": AiengResource(home=str(home), config_path=str(TINY_CONFIG))}
    graph = [model_checkpoint, benchmark_report, serving_bundle, *ALL_CHECKS]
    selection = [model_checkpoint, benchmark_report, serving_bundle]
    # Not `with instance:`: DagsterInstance.__exit__ (1.13.27) disposes but never resets the
    # current DefsStateStorage its __enter__ set, so every later get_repository_def in this
    # process would find a storage whose instance is gone.
    instance = dg.DagsterInstance.from_config(str(dagster_home))
    try:
        for _ in range(2):  # two points on each plot
            result = dg.materialize(graph, instance=instance, resources=resources, selection=selection)
            assert result.success
        bundle_id = latest_metadata(instance, "serving_bundle")["bundle_id"]
        report = gate_report(bundle_id, home / "deployments" / "gate-reports" / f"{bundle_id}-ui.json")
        instance.report_runless_asset_event(
            dg.AssetMaterialization(
                asset_key=production_deployment.key,
                metadata=promoted_metadata(report),
                tags={"dagster/data_version": f"{bundle_id}:{report['event']['sequence']}"},
            )
        )
        metadata = {key: latest_metadata(instance, key) for key in HEADLINES}
    finally:
        instance.dispose()
    with dagster_in_own_group(["dagster-webserver"], root, home, dagster_home, log) as webserver:
        client = DagsterGraphQLClient("127.0.0.1", port_number=webserver.port, timeout=60)
        wait_until_loaded(client, webserver.process, log)
        assert client._execute(SHOW_NUX)["shouldShowNux"] is False
        yield Served(webserver.port, root / "shots", metadata)


def open_overview(page: Page, port: int, key: str, first_row: str) -> None:
    page.goto(f"http://127.0.0.1:{port}/assets/{key}", timeout=PAGE_TIMEOUT_S * 1000)
    page.wait_for_function(
        f"() => Array.from(document.querySelectorAll({METADATA_ROWS!r}), r => r.cells[0]?.innerText.trim())"
        f".includes({first_row!r})",
        timeout=PAGE_TIMEOUT_S * 1000,
    )
    page.wait_for_function("() => Array.from(document.images).every(i => i.complete)", timeout=30_000)
    page.wait_for_timeout(1500)  # the onboarding dialog opens 1 s after the page (CommunityNux.tsx)


def save(page: Page, served: Served, name: str) -> Path:
    served.shots.mkdir(exist_ok=True)
    path = served.shots / f"{name}.png"
    page.screenshot(path=str(path))
    copy_to = os.environ.get("AIENG_UI_SHOTS")
    if copy_to:
        Path(copy_to).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(copy_to) / path.name)
    return path


@pytest.fixture(scope="module")
def pages(served: Served) -> Iterator[dict[str, Any]]:
    """Each overview page as the browser drew it: its metadata rows, and whether a dialog is open."""
    chromium = shutil.which("chromium")
    assert chromium, "chromium is not installed: install the Debian package `chromium` (`make system-deps` does)"
    found: dict[str, Any] = {}
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport=VIEWPORT)
            for key, headline in HEADLINES.items():
                open_overview(page, served.port, key, headline[0])
                shot = save(page, served, key)
                rows = page.evaluate(READ_ROWS, METADATA_ROWS)
                dialogs = page.locator("[role=dialog]").count()
                found[key] = {"shot": shot, "rows": rows, "dialogs": dialogs, "text": page.inner_text("body")}
            # The Plots view of the report: Dagster's own charts of its numeric metadata.
            open_overview(page, served.port, "benchmark_report", HEADLINES["benchmark_report"][0])
            page.get_by_role("button", name="Plots").click()
            page.wait_for_function(
                "() => document.body.innerText.includes('tokens_per_second_batch_4')", timeout=PAGE_TIMEOUT_S * 1000
            )
            page.wait_for_timeout(1000)
            # The plots come in the order of their names: show the first of the on-call ones.
            page.get_by_text("tokens_per_second_batch_1", exact=True).scroll_into_view_if_needed()
            found["plots"] = {"shot": save(page, served, "benchmark_report-plots"), "text": page.inner_text("body")}
        finally:
            browser.close()
    yield found


@pytest.mark.parametrize("key", list(HEADLINES))
def test_the_on_call_figures_lead_the_page_uncut(
    served: Served, pages: dict[str, Any], key: str, capsys: pytest.CaptureFixture[str]
) -> None:
    page, values = pages[key], served.metadata[key]
    with capsys.disabled():  # shown even when the test passes: people look at it
        print(f"\n{key} overview screenshot: {page['shot']}")
    rows = page["rows"]
    headline = HEADLINES[key]
    assert [row["key"] for row in rows[: len(headline)]] == headline, [row["key"] for row in rows]
    for row in rows[: len(headline)]:
        name, expected = row["key"], values[row["key"]]
        where = f"{key}.{name}: {row}"
        if not name.endswith("_chart"):  # the charts follow the figures, a little lower
            assert row["top"] < 1000, f"{where}: below a 1600x1000 window's first screen"
        assert row["right"] <= row["edge"] + 1, f"{where}: cut at the table's edge"
        if isinstance(expected, float | int) and not isinstance(expected, bool):
            assert float(row["value"]) == pytest.approx(expected, rel=1e-12), where
        elif name.endswith("_chart"):
            assert row["images"] == [{"svg": True, "drawn": True}], where
            assert row["value"].strip() == expected.rsplit("\n", 1)[-1], where  # the caption
        else:  # text, or short markdown (model_checkpoint's training): shown as written
            assert row["value"].strip() == expected, where
    assert page["dialogs"] == 0 and ONBOARDING_TEXT not in page["text"], f"a dialog covers {page['shot']}"


def test_the_gate_verdict_names_the_promotion(served: Served, pages: dict[str, Any]) -> None:
    rows = {row["key"]: row for row in pages["production_deployment"]["rows"]}
    bundle_id = served.metadata["serving_bundle"]["bundle_id"]
    assert rows["verdict"]["value"].strip() == f"promoted {bundle_id} to production (sequence 2, was {DEPLOYED})"
    assert rows["bundle_id"]["value"].strip() == bundle_id
    for name in ("stress_concurrency_4_ttft_p99_ms", "latency_ratio_vs_deployed", "time_to_rollback_seconds"):
        assert float(rows[name]["value"]) == served.metadata["production_deployment"][name], name
    # The tables are drawn in place, not behind a link, and not cut at the table's edge.
    for name in ("gate_steps", "stress_levels", "quality"):
        assert "[Show Markdown]" not in rows[name]["value"] and "|" not in rows[name]["value"], name
        assert rows[name]["right"] <= rows[name]["edge"] + 1, rows[name]


def test_the_png_plots_stay_one_click_away(pages: dict[str, Any]) -> None:
    """What the UI does with an image of tens of KiB in markdown: a link (evidence for the docs)."""
    rows = {row["key"]: row for row in pages["benchmark_report"]["rows"]}
    assert rows["throughput_plot"]["value"].strip() == "[Show Markdown]"
    assert rows["throughput_plot"]["images"] == []


def test_the_numbers_plot(pages: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    with capsys.disabled():
        print(f"\nbenchmark_report plots screenshot: {pages['plots']['shot']}")
    text = pages["plots"]["text"]
    for name in ("validation_loss", "validation_bits_per_byte", "tokens_per_second_batch_4"):
        assert name in text, name
    assert "throughput_chart" not in text  # markdown is not plotted: only numbers are
