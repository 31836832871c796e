"""AIENG_EXECUTOR picks where a run's steps execute (orchestration/executor.py): in the run's own
process by default, as Celery tasks when it says `celery` or when the code location is loaded
by a Celery worker; anything else is a load error naming the variable. The Celery executor run
for real: tests/e2e/test_celery_executor.py."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest
from dagster_celery import celery_executor

from aieng_core.config import ConfigError
from orchestration.executor import in_celery_worker, selected_executor
from tests.conftest import TINY_CONFIG
from tests.orchestration.test_load_errors import program, run


@pytest.mark.parametrize(
    ("argv", "worker"),
    [
        # `dagster-celery worker start` execs this; its pool processes are forks with the same argv.
        (["/venv/bin/celery", "-A", "dagster_celery.app", "worker", "-n", "worker1"], True),
        (["/venv/bin/celery", "-A", "dagster_celery.app", "inspect", "ping"], False),
        (["/venv/bin/dagster-celery", "worker", "list"], False),
        (["/venv/bin/dagster", "asset", "materialize", "-m", "orchestration.definitions"], False),
        ([], False),
    ],
)
def test_which_processes_are_celery_workers(argv: list[str], worker: bool) -> None:
    assert in_celery_worker(argv) is worker


@pytest.mark.parametrize(
    ("value", "executor"),
    [("", dg.in_process_executor), ("in_process", dg.in_process_executor), (" celery ", celery_executor)],
)
def test_the_variable_picks_the_executor(monkeypatch: pytest.MonkeyPatch, value: str, executor: object) -> None:
    monkeypatch.setenv("AIENG_EXECUTOR", value)
    assert selected_executor() is executor


def test_a_worker_without_the_variable_runs_on_celery(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AIENG_EXECUTOR", raising=False)
    monkeypatch.setattr("sys.argv", ["/venv/bin/celery", "-A", "dagster_celery.app", "worker"])
    assert selected_executor() is celery_executor
    monkeypatch.setenv("AIENG_EXECUTOR", "in_process")  # said outright, it is what counts
    assert selected_executor() is dg.in_process_executor


@pytest.mark.parametrize("value", ["multiprocess", "Celery", "k8s"])
def test_another_value_is_an_error_naming_the_variable(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("AIENG_EXECUTOR", value)
    with pytest.raises(ConfigError) as raised:
        selected_executor()
    assert str(raised.value) == f"AIENG_EXECUTOR={value!r} is not an executor: use one of in_process, celery"


def test_dagster_prints_the_one_line_and_exits_2(tmp_path: Path) -> None:
    listing = [program("dagster"), "asset", "list", "-m", "orchestration.definitions"]
    done = run(listing, TINY_CONFIG, tmp_path, AIENG_EXECUTOR="multiprocess")
    assert (done.returncode, done.stdout) == (2, ""), done.stderr[-3000:]
    assert done.stderr.splitlines()[-1] == (
        "aieng: error: AIENG_EXECUTOR='multiprocess' is not an executor: use one of in_process, celery"
    )
