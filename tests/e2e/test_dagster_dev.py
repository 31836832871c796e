"""`dagster dev` driven from outside, as a script or a person drives it: a partition range of the
data assets launched through the official GraphQL client, what the run recorded read back
through GraphQL, the UI's asset graph rendered in headless Chromium (the screenshot is kept
for people to look at; the test prints where), and an `aieng deploy rollback` that tells the
webserver, read back through GraphQL as production_deployment's latest materialization."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
from dagster import DagsterRunStatus
from dagster_graphql import DagsterGraphQLClient, DagsterGraphQLClientError
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError
from playwright.sync_api import sync_playwright

from aieng_core import asset_keys
from aieng_core.config import load_config
from aieng_core.data import clean_documents, raw_documents
from aieng_core.data.demo_data import land_demo_data
from aieng_core.data.reasons import ALL_REASONS
from aieng_core.dataset import dataset_manifest
from aieng_core.hashing import sha256_json
from aieng_core.store import ArtifactStore
from aieng_core.tokenizer import bpe_tokenizer, tokenized_documents

pytestmark = [
    pytest.mark.e2e,
    # gql (under DagsterGraphQLClient) warns about its own keyword arguments on every query.
    pytest.mark.filterwarnings("ignore:Using variable_values and operation_name:DeprecationWarning"),
]

REPO_ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
TINY_CONFIG = REPO_ROOT / "configs" / "tiny.yaml"
JOB = "daily_ingest"  # orchestration/schedules.py: the data assets, raw_documents to dataset_manifest
PARTITIONS = ["2026-01-01", "2026-01-02"]
CODE_VERSIONS = {
    raw_documents.KIND: raw_documents.CODE_VERSION,
    clean_documents.KIND: clean_documents.CODE_VERSION,
    bpe_tokenizer.KIND: bpe_tokenizer.CODE_VERSION,
    tokenized_documents.KIND: tokenized_documents.CODE_VERSION,
    dataset_manifest.KIND: dataset_manifest.CODE_VERSION,
}
PARTITIONED = {raw_documents.KIND, clean_documents.KIND, tokenized_documents.KIND}
ALL_ASSET_KEYS = sorted(value for name, value in vars(asset_keys).items() if name.isupper())
# Deadlines, not expectations: on a 2-core machine dagster dev answered in 37 s and the run took
# 19 s; with the machine busy with other work, 56-91 s and 34-45 s.
START_TIMEOUT_S = 240
RUN_TIMEOUT_S = 240
PAGE_TIMEOUT_S = 120
# A courtesy before SIGKILL, not a wait for a clean exit: the gRPC code servers take 15-25 s to
# stop here, and what a killed dagster dev leaves behind lies in the test's own TMPDIR.
STOP_GRACE_S = 5
# Wide enough that the whole graph fits at a zoom where the UI draws full asset nodes with
# whole names (below 0.6 it draws boxes with middle-truncated names).
VIEWPORT = {"width": 3200, "height": 800}
# The graph draws each node in an SVG foreignObject: an asset's text starts with its key and says
# "Loading" until its live data (latest materialization, checks) arrives.
EVERY_KEY_DRAWN_AND_LOADED = """keys => {
    const texts = Array.from(document.querySelectorAll('svg foreignObject'), e => e.textContent);
    return keys.every(k => texts.some(t => t.startsWith(k))) && !texts.some(t => t.includes('Loading'));
}"""
# Playwright adds --headless, --no-sandbox and a fresh profile. These keep Chromium's own
# services from reaching out: on a closed network each such connection fails, many at a time.
CHROMIUM_ARGS = [
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

GRAPHQL_LOCATIONS = """
query { workspaceOrError { __typename ... on Workspace {
  locationEntries { name loadStatus locationOrLoadError { __typename ... on PythonError { message } } } } } }
"""
GRAPHQL_RUN_ERRORS = """
query ($runId: ID!) { logsForRun(runId: $runId) { __typename ... on EventConnection {
  events { __typename ... on MessageEvent { message } ... on ErrorEvent { error { message stack } } } } } }
"""
GRAPHQL_ASSET_NODES = "query { assetNodes { assetKey { path } groupName } }"
GRAPHQL_MATERIALIZED = """
query ($key: AssetKeyInput!, $partition: String, $partitions: [String!]) {
  assetNodeOrError(assetKey: $key) { __typename ... on AssetNode {
    opVersion
    dataVersion(partition: $partition)
    assetMaterializations(partitions: $partitions) {
      runId partition
      tags { key value }
      metadataEntries { label
        ... on TextMetadataEntry { text } ... on IntMetadataEntry { intValue } ... on BoolMetadataEntry { boolValue } }
    } } } }
"""


@dataclass
class DagsterDev:
    client: DagsterGraphQLClient
    port: int
    home: Path
    env: dict[str, str]
    log: Path


@dataclass
class Materialized:
    """One asset (and partition) as the instance tells it through GraphQL."""

    code_version: str
    data_version: str
    run_id: str
    partition: str | None
    tags: dict[str, str]
    metadata: dict[str, Any]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def log_tail(log: Path) -> str:
    return log.read_text(encoding="utf-8", errors="replace")[-6000:]


def default_sigint() -> None:
    """Runs in the child before `dagster dev` starts. A shell that starts pytest in the background
    makes it ignore SIGINT, children inherit that, and dagster maps SIGTERM to whatever SIGINT
    does: SIGTERM would be ignored too, in every process of the group."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def living_members(pgid: int) -> list[psutil.Process]:
    """The processes of the group that have not exited (a zombie has; its parent reaps it later)."""
    living = []
    for process in psutil.process_iter():
        try:
            if os.getpgid(process.pid) == pgid and process.status() != psutil.STATUS_ZOMBIE:
                living.append(process)
        except (ProcessLookupError, psutil.NoSuchProcess):
            continue
    return living


def stop_group(process: subprocess.Popen[bytes]) -> list[str]:
    """SIGTERM the whole process group, give it STOP_GRACE_S, SIGKILL what is left; returns a
    description of every process of the group, or spawned by it, that still lives."""
    pgid = process.pid  # start_new_session: the leader's pid is the group id
    try:
        spawned = psutil.Process(process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        spawned = []
    for sig, grace_s in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + grace_s
        while living_members(pgid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if not living_members(pgid):
            break
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
    survivors = {p.pid: p for p in living_members(pgid)}
    for child in spawned:  # one that left the group (setsid) would still be ours
        try:
            if child.is_running() and child.status() != psutil.STATUS_ZOMBIE:
                survivors[child.pid] = child
        except psutil.NoSuchProcess:
            continue
    return [f"{pid} {' '.join(p.cmdline())[:200]}" for pid, p in survivors.items()]


@dataclass
class DagsterProcess:
    process: subprocess.Popen[bytes]
    env: dict[str, str]
    port: int


@contextmanager
def dagster_in_own_group(
    program: list[str], root: Path, home: Path, dagster_home: Path, log: Path
) -> Iterator[DagsterProcess]:
    """`program` (`dagster dev`, `dagster-webserver`) on a free loopback port, serving
    workspace.yaml with the test's AIENG_HOME, DAGSTER_HOME and TMPDIR (root/tmp: its workspace
    file and code-server sockets), in a process group of its own: stopped as one on the way out
    (stop_group), and failing the test if any of its processes outlives SIGTERM and SIGKILL."""
    env = dict(os.environ)
    env.update(
        AIENG_HOME=str(home),
        DAGSTER_HOME=str(dagster_home),
        AIENG_CONFIG=str(TINY_CONFIG),
        TMPDIR=str(root / "tmp"),
        PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
    )
    port = free_port()
    with log.open("wb") as log_file:
        process = subprocess.Popen(
            [str(BIN / program[0]), *program[1:], "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(port)],
            cwd=REPO_ROOT,
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group (it and its code servers), stopped as one
            preexec_fn=default_sigint,
        )
    try:
        yield DagsterProcess(process, env, port)
    finally:
        stopping = time.monotonic()
        survivors = stop_group(process)
        print(f"{' '.join(program)} stopped in {time.monotonic() - stopping:.1f} s")
    assert survivors == [], f"processes of {' '.join(program)} outlived SIGTERM and SIGKILL:\n" + "\n".join(survivors)


def wait_until_loaded(client: DagsterGraphQLClient, process: subprocess.Popen[bytes], log: Path) -> None:
    """Until the webserver answers GraphQL and the code location has loaded; fails at once if
    `dagster dev` exits or the code location fails to load."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        assert process.poll() is None, f"dagster dev exited {process.returncode}:\n{log_tail(log)}"
        try:
            workspace = client._execute(GRAPHQL_LOCATIONS)["workspaceOrError"]
        except DagsterGraphQLClientError:  # not listening yet
            time.sleep(0.5)
            continue
        entries = workspace.get("locationEntries", [])
        for entry in entries:
            error = entry["locationOrLoadError"]
            assert not error or error["__typename"] != "PythonError", f"{entry['name']}: {error['message']}"
        if entries and all(entry["loadStatus"] == "LOADED" for entry in entries):
            assert [entry["name"] for entry in entries] == ["orchestration.definitions"]
            return
        time.sleep(0.5)
    pytest.fail(f"dagster dev did not load the code location within {START_TIMEOUT_S} s:\n{log_tail(log)}")


def wait_for_run(client: DagsterGraphQLClient, run_id: str, log: Path) -> None:
    deadline = time.monotonic() + RUN_TIMEOUT_S
    status = client.get_run_status(run_id)
    while status not in (DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED):
        assert time.monotonic() < deadline, f"run {run_id} still {status.value} after {RUN_TIMEOUT_S} s"
        time.sleep(0.5)
        status = client.get_run_status(run_id)
    if status != DagsterRunStatus.SUCCESS:
        logs = client._execute(GRAPHQL_RUN_ERRORS, {"runId": run_id})["logsForRun"]
        errors = [
            f"{event['__typename']}: {event.get('message')}\n{(event.get('error') or {}).get('stack') or ''}"
            for event in logs.get("events", [])
            if event.get("error") or event["__typename"] in ("RunFailureEvent", "ExecutionStepFailureEvent")
        ]
        pytest.fail(f"run {run_id} ended {status.value}:\n" + "\n".join(errors) + f"\n{log_tail(log)}")


def materialized(client: DagsterGraphQLClient, key: str, partition: str | None) -> Materialized:
    variables = {"key": {"path": [key]}, "partition": partition, "partitions": [partition] if partition else None}
    node = client._execute(GRAPHQL_MATERIALIZED, variables)["assetNodeOrError"]
    assert node["__typename"] == "AssetNode", node
    events = node["assetMaterializations"]
    assert len(events) == 1, f"{key} {partition}: {len(events)} materializations, expected exactly 1"
    event = events[0]
    return Materialized(
        code_version=node["opVersion"],
        data_version=node["dataVersion"],
        run_id=event["runId"],
        partition=event["partition"],
        tags={tag["key"]: tag["value"] for tag in event["tags"]},
        metadata={
            entry["label"]: entry.get("text", entry.get("intValue", entry.get("boolValue")))
            for entry in event["metadataEntries"]
        },
    )


def run_cli(dev: DagsterDev, *args: str) -> str:
    result = subprocess.run(
        [str(BIN / args[0]), *args[1:]], cwd=REPO_ROOT, env=dev.env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, f"{args} exited {result.returncode}\n{result.stdout}\n{result.stderr[-4000:]}"
    return result.stdout


def render_asset_graph(chromium: str, url: str, screenshot: Path) -> list[str]:
    """Loads the page in headless Chromium until every asset node is drawn with its live data,
    writes the screenshot and returns the text of each graph node (groups and assets). A page
    that never gets there fails the test, naming what it shows, with a screenshot of it."""
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport=VIEWPORT)
            page.goto(url, timeout=PAGE_TIMEOUT_S * 1000)
            try:
                page.wait_for_function(
                    EVERY_KEY_DRAWN_AND_LOADED,
                    arg=ALL_ASSET_KEYS,
                    timeout=PAGE_TIMEOUT_S * 1000,
                )
                timed_out = False
            except PlaywrightTimeoutError:
                timed_out = True
            page.screenshot(path=str(screenshot))
            texts: list[str] = page.eval_on_selector_all("svg foreignObject", "els => els.map(e => e.textContent)")
        finally:
            browser.close()
    if timed_out:
        pytest.fail(
            f"{url} did not draw every asset key with its live data within {PAGE_TIMEOUT_S} s; "
            f"its graph nodes say {texts}; screenshot: {screenshot}"
        )
    return texts


@pytest.fixture(scope="module")
def dagster_dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DagsterDev]:
    root = tmp_path_factory.mktemp("dagster-dev").resolve()
    home, dagster_home, log = root / "aieng-home", root / "dagster-home", root / "dagster-dev.log"
    dagster_home.mkdir()
    (root / "tmp").mkdir()  # dagster dev's workspace file and code-server sockets
    # As shipped: it turns off the onboarding dialog that would cover the screenshot.
    shutil.copy(REPO_ROOT / "configs" / "dagster.yaml", dagster_home / "dagster.yaml")
    started = time.monotonic()
    with dagster_in_own_group(["dagster", "dev"], root, home, dagster_home, log) as dev:
        land_demo_data(home)  # while dagster dev starts: only the run reads it
        client = DagsterGraphQLClient("127.0.0.1", port_number=dev.port, timeout=60)
        wait_until_loaded(client, dev.process, log)
        print(f"dagster dev answered in {time.monotonic() - started:.1f} s")
        yield DagsterDev(client=client, port=dev.port, home=home, env=dev.env, log=log)


@pytest.fixture(scope="module")
def ingest_run(dagster_dev: DagsterDev) -> str:
    """The data assets for PARTITIONS, launched as one run through the GraphQL client (every
    partitioned asset carries BackfillPolicy.single_run(), so a range runs in one run)."""
    started = time.monotonic()
    run_id = dagster_dev.client.submit_job_execution(
        JOB,
        tags={
            "dagster/asset_partition_range_start": PARTITIONS[0],
            "dagster/asset_partition_range_end": PARTITIONS[-1],
        },
    )
    wait_for_run(dagster_dev.client, run_id, dagster_dev.log)
    print(f"run {run_id} succeeded in {time.monotonic() - started:.1f} s")
    return run_id


def test_run_records_each_assets_code_version_and_data_version(dagster_dev: DagsterDev, ingest_run: str) -> None:
    store = ArtifactStore(dagster_dev.home)
    for key, code_version in CODE_VERSIONS.items():
        if key in PARTITIONED:
            artifacts = {p: store.require_current(key, p) for p in PARTITIONS}
            # One run, one step per asset, one data version for the step: the hash of the
            # partitions' content hashes (orchestration/metadata.py materialize_partitions).
            range_version = sha256_json([[p, artifacts[p].content_sha256] for p in PARTITIONS])
            expected = [(p, artifacts[p], range_version) for p in PARTITIONS]
        else:
            artifact = store.require_current(key)
            expected = [(None, artifact, artifact.content_sha256)]
        for partition, artifact, data_version in expected:
            found = materialized(dagster_dev.client, key, partition)
            where = f"{key} {partition or ''}"
            assert found.run_id == ingest_run, where
            assert found.partition == partition, where
            assert found.code_version == code_version, where
            assert found.tags["dagster/code_version"] == code_version, where
            assert found.tags["dagster/data_version"] == data_version, where
            assert found.data_version == data_version, where
            assert found.metadata["artifact_id"] == artifact.id, where
            assert found.metadata["content_sha256"] == artifact.content_sha256, where
            assert found.metadata["reused"] is False, where  # a fresh AIENG_HOME


def test_metadata_carries_the_data_report_counts_and_input_ids(dagster_dev: DagsterDev, ingest_run: str) -> None:
    store = ArtifactStore(dagster_dev.home)
    for partition in PARTITIONS:
        report = json.loads(run_cli(dagster_dev, "aieng", "data", "report", "--partition", partition, "--json"))
        metadata = materialized(dagster_dev.client, clean_documents.KIND, partition).metadata
        assert metadata["artifact_id"] == report["artifact_id"]
        for count in ("rows_expected", "rows_in", "rows_clean", "rows_quarantined"):
            assert metadata[count] == report[count], f"{partition} {count}"
        assert {reason: metadata[f"quarantined_{reason}"] for reason in ALL_REASONS} == report["reasons"]
        assert metadata["rows_in"] == metadata["rows_clean"] + metadata["rows_quarantined"] > 0
        assert metadata["input_ids"] == store.require_current(raw_documents.KIND, partition).id

    tokenizer = store.require_current(bpe_tokenizer.KIND)
    tokenizer_metadata = materialized(dagster_dev.client, bpe_tokenizer.KIND, None).metadata
    assert tokenizer_metadata["training_partitions"] == ", ".join(PARTITIONS)
    assert tokenizer_metadata["vocab_size"] == load_config(TINY_CONFIG).tokenizer.vocab_size
    for partition in PARTITIONS:
        assert materialized(dagster_dev.client, tokenized_documents.KIND, partition).metadata["tokenizer_id"] == (
            tokenizer.id
        )
    dataset = materialized(dagster_dev.client, dataset_manifest.KIND, None).metadata
    assert dataset["partitions"] == len(PARTITIONS)
    assert dataset["tokenizer_id"] == tokenizer.id


def test_asset_graph_page_shows_every_asset_key(
    dagster_dev: DagsterDev,
    ingest_run: str,
    tmp_path_factory: pytest.TempPathFactory,
    capsys: pytest.CaptureFixture[str],
) -> None:
    chromium = shutil.which("chromium")
    assert chromium, "chromium is not installed: install the Debian package `chromium` (`make system-deps` does)"
    nodes = dagster_dev.client._execute(GRAPHQL_ASSET_NODES)["assetNodes"]
    assert sorted("/".join(node["assetKey"]["path"]) for node in nodes) == ALL_ASSET_KEYS

    # Every group expanded (the UI shows a graph of several groups collapsed); the group ids are
    # the UI's, `global@global:<group>` while its per-code-location groups flag is off (default).
    groups = sorted({node["groupName"] for node in nodes})
    url = f"http://127.0.0.1:{dagster_dev.port}/asset-groups?expanded=" + ",".join(f"global@global:{g}" for g in groups)
    screenshot = tmp_path_factory.mktemp("asset-graph") / "asset-graph.png"
    texts = render_asset_graph(chromium, url, screenshot)
    with capsys.disabled():  # shown even when the test passes: people look at it
        print(f"\nasset graph screenshot: {screenshot}")

    for key in ALL_ASSET_KEYS:
        assert len([t for t in texts if t.startswith(key)]) == 1, f"{key} is not drawn exactly once"
    node_text = {key: next(t for t in texts if t.startswith(key)) for key in ALL_ASSET_KEYS}
    # The UI shows what the run just did: the unpartitioned data assets are materialized,
    # nothing downstream of dataset_manifest is.
    for key in (bpe_tokenizer.KIND, dataset_manifest.KIND):
        assert "Materialized" in node_text[key] and "Never materialized" not in node_text[key], node_text[key]
    for key in (asset_keys.MODEL_CHECKPOINT, asset_keys.SERVING_BUNDLE):
        assert "Never materialized" in node_text[key], node_text[key]

    png = screenshot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", png[16:24]) == (VIEWPORT["width"], VIEWPORT["height"])
    assert len(png) > 50_000, f"{screenshot} is {len(png)} bytes: an empty page, not a graph"


def test_a_cli_rollback_is_production_deployments_latest_materialization(
    dagster_dev: DagsterDev, serving_bundle_artifact: Any, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """`aieng deploy rollback` with AIENG_DAGSTER_URL naming the webserver: the asset's latest
    materialization, read back through GraphQL, names the bundle rolled back to and the
    rollback's sequence. The CLI's home is its own (dagster dev's pointer sensor watches another,
    where nothing is deployed), so only the CLI can have told Dagster."""
    from aieng_core.deploy.deployments import Deployments
    from tests.core.deploy import build_bundle_pair, home_with_bundles

    pair = build_bundle_pair(tmp_path_factory.mktemp("pointer-pair"), serving_bundle_artifact)
    home = home_with_bundles(tmp_path_factory.mktemp("pointer-cli") / "home", pair)
    production = Deployments(home)
    production.promote(pair.a.id, verify=False)
    production.promote(pair.b.id, verify=False)
    key = asset_keys.PRODUCTION_DEPLOYMENT
    node = dagster_dev.client._execute(GRAPHQL_MATERIALIZED, {"key": {"path": [key]}})["assetNodeOrError"]
    assert node["assetMaterializations"] == []  # nothing told Dagster of the two promotes

    env = {**dagster_dev.env, "AIENG_DAGSTER_URL": f"http://127.0.0.1:{dagster_dev.port}"}
    done = subprocess.run(
        [str(BIN / "aieng"), "--home", str(home), "deploy", "rollback", "--reason", "x", "--json"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (done.returncode, done.stderr) == (0, ""), done.stderr[-4000:]
    event = json.loads(done.stdout)["event"]
    assert (event["sequence"], event["to"]) == (3, pair.a.id)

    found = materialized(dagster_dev.client, key, None)
    assert found.run_id == ""  # a runless materialization
    assert {name: found.metadata[name] for name in ("bundle_id", "sequence", "action", "from", "reason")} == {
        "bundle_id": pair.a.id,
        "sequence": 3,
        "action": "rollback",
        "from": pair.b.id,
        "reason": "x",
    }
    assert found.metadata["reported_by"] == "aieng deploy rollback"
    assert found.tags["dagster/data_version"] == found.data_version == f"{pair.a.id}:3"
