"""A bad config stops every command that loads the code location with one line naming the file
and the key, exit status 2, and no traceback unless AIENG_TRACEBACK=1 asks for one
(orchestration/load_errors.py); `aieng` says the same line the same way. The processes that host
the code location for the UI keep raising: tests/e2e/test_code_location_errors.py.

Each case runs the real program in a subprocess (about 3-5 s each)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest
import yaml

from orchestration.load_errors import cli_command
from tests.conftest import REPO_ROOT, TINY_CONFIG

BIN = Path(sys.executable).parent
TIMEOUT_S = 120
MATERIALIZE = ["asset", "materialize", "-m", "orchestration.definitions", "--select", "raw_documents"]
PARTITION = ["--partition", "2026-01-01"]
BAD_STEPS = "training.max_steps: Input should be greater than or equal to 1 (got -3)"
BAD_CRON = (
    "gate.retrain_cron: 'every monday' is not a cron expression of 5 fields "
    "(minute hour day-of-month month day-of-week)"
)


def program(name: str) -> str:
    path = BIN / name
    assert path.exists(), f"{path} is missing: `make install` installs it (pyproject.toml)"
    return str(path)


def bad_config(tmp_path: Path, old: str, new: str) -> Path:
    text = TINY_CONFIG.read_text(encoding="utf-8")
    assert old in text
    path = tmp_path / "bad.yaml"
    path.write_text(text.replace(old, new, 1), encoding="utf-8")
    return path


def run(args: list[str], config: Path, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    dagster_home = tmp_path / "dagster-home"
    dagster_home.mkdir(exist_ok=True)
    (dagster_home / "dagster.yaml").write_bytes((REPO_ROOT / "configs" / "dagster.yaml").read_bytes())  # as make does
    variables = {name: value for name, value in os.environ.items() if name != "AIENG_TRACEBACK"}
    variables.update(AIENG_CONFIG=str(config), AIENG_HOME=str(tmp_path / "home"), DAGSTER_HOME=str(dagster_home), **env)
    return subprocess.run(args, cwd=REPO_ROOT, env=variables, capture_output=True, text=True, timeout=TIMEOUT_S)


def without_supersession_warnings(stderr: str) -> list[str]:
    """stderr's lines less Dagster's SupersessionWarning (the warning and the source line
    Python prints under it), which every superseded `dagster` command prints first."""
    lines, kept = stderr.splitlines(), []
    skip_next = False
    for line in lines:
        if skip_next:
            skip_next = False
            continue
        if "SupersessionWarning: " in line:
            skip_next = True
            continue
        kept.append(line)
    return kept


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        (["/venv/bin/dagster", "asset", "materialize", "-m", "x"], "dagster asset"),
        (["/venv/lib/python3.11/site-packages/dagster/__main__.py", "job", "execute"], "dagster job"),
        (["/venv/bin/dg", "launch", "--assets", "x"], "dg launch"),
        (["/venv/bin/dg", "--verbose", "check", "defs"], "dg check"),
        # Processes that host the code location, or start those that do: the error reaches Dagster.
        (["/venv/lib/python3.11/site-packages/dagster/__main__.py", "api", "grpc", "--lazy-load-user-code"], None),
        (["/venv/lib/python3.11/site-packages/dagster/__main__.py", "code-server", "start"], None),
        (["/venv/lib/python3.11/site-packages/dagster/__main__.py", "api", "execute_run", "{}"], None),
        (["/venv/bin/dagster", "dev", "-w", "workspace.yaml"], None),
        (["/venv/bin/dg", "dev"], None),
        (["/venv/bin/dagster-webserver", "-m", "orchestration.definitions"], None),
        (["/venv/bin/dagster-daemon", "run"], None),
        (["/venv/bin/pytest", "tests"], None),
        (["-c"], None),
        ([], None),
    ],
)
def test_which_processes_print_the_one_line(argv: list[str], command: str | None) -> None:
    assert cli_command(argv) == command


def test_dagster_asset_materialize_prints_one_line_and_exits_2(tmp_path: Path) -> None:
    bad = bad_config(tmp_path, "max_steps: ", "max_steps: -3 #")
    done = run([program("dagster"), *MATERIALIZE, *PARTITION], bad, tmp_path)
    assert done.returncode == 2, done.stderr[-3000:]
    assert without_supersession_warnings(done.stderr) == [f"aieng: error: {bad}: invalid config: {BAD_STEPS}"]
    assert done.stdout == ""


def test_dg_launch_prints_one_line_and_exits_2(tmp_path: Path) -> None:
    """A bad cron: the error comes from schedules.py, after the partitions loaded."""
    bad = bad_config(tmp_path, 'retrain_cron: "0 3 * * 1"', 'retrain_cron: "every monday"')
    done = run([program("dg"), "launch", "--assets", "raw_documents", *PARTITION], bad, tmp_path)
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.splitlines() == [f"aieng: error: {bad}: invalid config: {BAD_CRON}"]
    assert done.stdout == ""


def test_aieng_traceback_shows_the_traceback(tmp_path: Path) -> None:
    bad = bad_config(tmp_path, "max_steps: ", "max_steps: -3 #")
    done = run(
        [program("dagster"), "asset", "list", "-m", "orchestration.definitions"], bad, tmp_path, AIENG_TRACEBACK="1"
    )
    assert done.returncode == 1
    lines = done.stderr.splitlines()
    assert lines[0] == "Traceback (most recent call last):"
    assert lines[-1] == f"aieng_core.config.ConfigError: {bad}: invalid config: {BAD_STEPS}"


@pytest.mark.parametrize("traceback", ["", "1"])
def test_aieng_prints_the_same_line_and_exits_2(tmp_path: Path, traceback: str) -> None:
    bad = bad_config(tmp_path, "max_steps: ", "max_steps: -3 #")
    done = run([program("aieng"), "model", "train"], bad, tmp_path, AIENG_TRACEBACK=traceback)
    if traceback:
        assert done.returncode == 1
        assert done.stderr.splitlines()[-1] == f"aieng_core.config.ConfigError: {bad}: invalid config: {BAD_STEPS}"
    else:
        assert (done.returncode, done.stdout) == (2, "")
        assert done.stderr.splitlines() == [f"aieng: error: {bad}: invalid config: {BAD_STEPS}"]


def test_instance_configs_turn_the_onboarding_dialog_off(tmp_path: Path) -> None:
    (tmp_path / "dagster.yaml").write_bytes((REPO_ROOT / "configs" / "dagster.yaml").read_bytes())
    instance = dg.DagsterInstance.from_config(str(tmp_path))
    try:
        assert instance.nux_enabled is False
        assert instance.telemetry_enabled is False
    finally:
        instance.dispose()
    # The other two need a database or a cluster to load (tests/e2e/test_dagster_postgres.py
    # loads the PostgreSQL one): the same key, as Dagster's schema reads it.
    for name in ("dagster-postgres.yaml", "dagster-k8s.yaml"):
        assert yaml.safe_load((REPO_ROOT / "configs" / name).read_text(encoding="utf-8"))["nux"] == {"enabled": False}
