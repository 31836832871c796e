"""A bad config, seen from the Dagster UI: a real `dagster-webserver` (its own process group,
killed as one) whose code server loads orchestration.definitions with a broken file. The code
server must raise, not print one line and exit as a CLI command does (orchestration/load_errors.py):
the UI then shows the code location as failed, with the config's one-line error as the cause, read
back here through GraphQL. The instance is configs/dagster.yaml in a fresh DAGSTER_HOME, so the
UI's onboarding dialog is off only because that file says so (shouldShowNux)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from dagster_graphql import DagsterGraphQLClient, DagsterGraphQLClientError

from tests.conftest import TINY_CONFIG
from tests.e2e.test_dagster_dev import BIN, REPO_ROOT, default_sigint, free_port, log_tail, stop_group

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.filterwarnings("ignore:Using variable_values and operation_name:DeprecationWarning"),
]

# A deadline, not an expectation: the webserver and its code server answer in 10-20 s here.
LOAD_TIMEOUT_S = 180
WORKSPACE = """
query { shouldShowNux workspaceOrError { __typename ... on Workspace { locationEntries { name loadStatus
  locationOrLoadError { __typename ... on PythonError { message errorChain { error { message } } } } } } } }
"""


def loaded_workspace(client: DagsterGraphQLClient, process: subprocess.Popen[bytes], log: Path) -> dict[str, Any]:
    """The GraphQL answer once the webserver answers and its code location finished loading."""
    deadline = time.monotonic() + LOAD_TIMEOUT_S
    while time.monotonic() < deadline:
        assert process.poll() is None, f"dagster-webserver exited {process.returncode}:\n{log_tail(log)}"
        try:
            answer = client._execute(WORKSPACE)
        except DagsterGraphQLClientError:  # not listening yet
            time.sleep(0.5)
            continue
        entries = answer["workspaceOrError"].get("locationEntries", [])
        if entries and all(entry["loadStatus"] == "LOADED" for entry in entries):
            return answer
        time.sleep(0.5)
    pytest.fail(f"the code location did not finish loading within {LOAD_TIMEOUT_S} s:\n{log_tail(log)}")


def test_the_ui_shows_a_bad_config_as_the_code_locations_load_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(TINY_CONFIG.read_text(encoding="utf-8") + "\nno_such_section: {}\n", encoding="utf-8")
    dagster_home, log = tmp_path / "dagster-home", tmp_path / "webserver.log"
    dagster_home.mkdir()
    (dagster_home / "dagster.yaml").write_bytes((REPO_ROOT / "configs" / "dagster.yaml").read_bytes())
    (tmp_path / "tmp").mkdir()  # the code server's socket
    env = {name: value for name, value in os.environ.items() if name != "AIENG_TRACEBACK"}
    env.update(
        AIENG_HOME=str(tmp_path / "home"),
        AIENG_CONFIG=str(bad),
        DAGSTER_HOME=str(dagster_home),
        TMPDIR=str(tmp_path / "tmp"),
    )
    port = free_port()
    command = [str(BIN / "dagster-webserver"), "-m", "orchestration.definitions", "-h", "127.0.0.1", "-p", str(port)]
    with log.open("wb") as log_file:
        process = subprocess.Popen(
            command,
            cwd=REPO_ROOT,
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=default_sigint,
        )
    try:
        answer = loaded_workspace(DagsterGraphQLClient("127.0.0.1", port_number=port, timeout=30), process, log)
    finally:
        survivors = stop_group(process)
    assert survivors == [], "processes of dagster-webserver outlived SIGTERM and SIGKILL:\n" + "\n".join(survivors)

    (entry,) = answer["workspaceOrError"]["locationEntries"]
    assert entry["name"] == "orchestration.definitions"
    error = entry["locationOrLoadError"]
    assert error["__typename"] == "PythonError", error  # failed, not loaded
    assert error["message"].startswith("dagster._core.errors.DagsterUserCodeLoadError: ")
    # The cause Dagster shows under it is the config's own line, once, with no exit in between.
    causes = [link["error"]["message"] for link in error["errorChain"]]
    assert causes == [f"aieng_core.config.ConfigError: {bad}: invalid config: no_such_section: unknown key\n"]
    assert answer["shouldShowNux"] is False
