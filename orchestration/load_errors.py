"""A bad config stops a Dagster CLI command with one line, not a traceback around that line.

The code location reads its config while it loads (partitions.py, schedules.py), and a bad file
stops the load with a ConfigError whose message names the file and the key. Who should show that
message depends on the process doing the loading:

- A process that hosts the code location for others must raise it, so that Dagster records it
  where people look: `dagster api grpc` and `dagster code-server start` (the code servers that
  `dagster dev`, the webserver and the daemon start: the UI shows the error as the code
  location's load error) and `dagster api execute_run` / `execute_step` (a run's worker: the
  run fails with it). `dagster dev` and `dg dev` only start such processes.
- A CLI command that loads the code location in its own process lets it escape as a traceback
  of 30-odd frames with the one line that matters at the bottom: `dagster asset materialize`,
  `dagster job execute`, `dagster asset list`, `dagster definitions validate`, `dg launch`,
  `dg check defs`, `dg list defs`. There the message is printed alone, on stderr, and the
  command exits 2, as `aieng` does for a bad config. AIENG_TRACEBACK=1 raises it instead.

Only the command line tells the two apart: Dagster starts its own subprocesses as `python -m
dagster api ...` / `python -m dagster code-server ...`, and nothing in the process says which
kind it is. A process that is not the `dagster` or `dg` program at all (a test, a notebook,
`dagster-webserver`, `dagster-daemon`) always gets the exception.

Commands that load the code location through a code server of their own (`dagster job launch`,
`dagster schedule|sensor list|start`) never import it themselves: they print the load error the
code server sent back, Dagster's traceback with this message as its cause.
"""

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from aieng_core.config import ConfigError, traceback_requested

# The commands of `dagster` and `dg` that host the code location for other processes, or start
# processes that do: a ConfigError there must reach Dagster.
HOSTING_COMMANDS = frozenset({"api", "code-server", "dev"})
CLI_PROGRAMS = frozenset({"dagster", "dg"})
EXIT_BAD_CONFIG = 2  # as `aieng` (aieng_core/cli) and click's own usage errors


def cli_command(argv: list[str] | None = None) -> str | None:
    """`dagster asset`, `dg launch`, ...: the CLI command this process runs, when it is one that
    loads the code location in its own process; None for any other process."""
    argv = sys.argv if argv is None else argv
    if not argv:
        return None
    program = Path(argv[0])
    # `python -m dagster` sets argv[0] to the package's __main__.py.
    name = program.parent.name if program.name == "__main__.py" else program.name
    if name not in CLI_PROGRAMS:
        return None
    command = next((arg for arg in argv[1:] if not arg.startswith("-")), None)
    if command is None or command in HOSTING_COMMANDS:
        return None
    return f"{name} {command}"


@contextmanager
def config_errors_end_cli_commands() -> Iterator[None]:
    """Around the code location's loading: in a CLI command (cli_command), a ConfigError is
    printed as its one line on stderr and the process exits 2; anywhere else it propagates."""
    try:
        yield
    except ConfigError as error:
        if cli_command() is None or traceback_requested():
            raise
        print(f"aieng: error: {error}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        # SystemExit is no Exception: neither the import machinery nor click catches it.
        raise SystemExit(EXIT_BAD_CONFIG) from None
