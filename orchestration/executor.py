"""Where a run's steps execute, chosen by AIENG_EXECUTOR when the code location loads.

- `in_process` (the default): every step in the run's own process. On one machine this is the
  fastest: a subprocess per step would pay ~4 s of imports each.
- `celery`: every step is a Celery task that a `dagster-celery` worker runs (dagster-celery
  0.29.27, the release of our Dagster pin). The run config says which broker:
  configs/dagster-celery.yaml, which the workers read too (`-y`), so both ends agree.

The choice is a deployment's, not a run's: it is read from the environment of the process that
loads the code location (the webserver's and daemon's code server, or the `dagster` CLI), so the
UI's Launchpad shows the executor config that runs will actually use. A Celery worker loads the
code location too (to rebuild the step it was sent, checking the run's config against this
executor's schema), so in a worker process the default is `celery`: a worker started without
AIENG_EXECUTOR still runs the steps it is sent instead of failing each on "unexpected config".
"""

import os
import sys
from pathlib import Path

import dagster as dg

from aieng_core.config import ConfigError

EXECUTOR_ENV = "AIENG_EXECUTOR"
EXECUTORS = ("in_process", "celery")


def in_celery_worker(argv: list[str] | None = None) -> bool:
    """`celery ... worker ...`, as `dagster-celery worker start` runs it (its pool processes are
    forks and keep the argv)."""
    argv = sys.argv if argv is None else argv
    return bool(argv) and Path(argv[0]).name == "celery" and "worker" in argv[1:]


def selected_executor() -> dg.ExecutorDefinition:
    choice = os.environ.get(EXECUTOR_ENV, "").strip() or ("celery" if in_celery_worker() else "in_process")
    if choice == "in_process":
        return dg.in_process_executor
    if choice == "celery":
        try:
            from dagster_celery import celery_executor
        except ImportError as error:  # a trimmed install: say what to add, not a traceback
            raise ConfigError(
                f"{EXECUTOR_ENV}=celery needs the dagster-celery package "
                f"(pip install 'dagster-celery[redis]==0.29.27'): {error}"
            ) from None
        return celery_executor
    raise ConfigError(f"{EXECUTOR_ENV}={choice!r} is not an executor: use one of {', '.join(EXECUTORS)}")
