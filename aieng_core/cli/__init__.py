"""The `aieng` command line. Every `--json` output is one JSON document on stdout; a refusal
is one line on stderr, never a traceback: exit 2 for a bad config (as argparse exits 2 for bad
arguments: what was given is wrong), 1 for any other refusal. AIENG_TRACEBACK=1 shows the
traceback instead. One module per command group."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from aieng_core.cli import bench, bundle, data, deploy, doctor, lineage, model, serve, store
from aieng_core.store import ArtifactIntegrityError, ArtifactNotFound

# Errors a user can act on: printed as one line, never as a traceback (a bad config's
# ConfigError is a ValueError: the config package, pydantic and all, loads only for the
# commands that read it, so a lookup such as `aieng lineage --request` starts fast).
USER_ERRORS = (ArtifactNotFound, ArtifactIntegrityError, FileNotFoundError, FileExistsError, ValueError)
# A reader that stopped reading (`aieng deploy status | head -3`) ends us as SIGPIPE would.
EXIT_BROKEN_PIPE = 128 + 13
EXIT_REFUSED = 1
EXIT_BAD_CONFIG = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="aieng", description="aieng: raw text to a deployed LLM, with lineage.")
    parser.add_argument("--home", help="state directory (default: $AIENG_HOME or ./.aieng)")
    parser.add_argument("--config", help="YAML config (default: $AIENG_CONFIG or configs/pipeline.yaml)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in (data, model, bundle, serve, deploy, lineage, store, bench, doctor):
        group.add_parsers(commands)
    return parser


def _stdout_gone() -> int:
    """The reader closed the pipe: nothing more can be said on stdout. Point it at /dev/null so
    the interpreter's last flush does not fail again, and exit as SIGPIPE would, quietly."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return EXIT_BROKEN_PIPE


def _refuse(exc: Exception) -> int | None:
    """Print the error as one line on stderr and give the exit status; None when
    AIENG_TRACEBACK asks for the traceback instead."""
    # Loaded here, not at the top: pydantic comes with it (see USER_ERRORS).
    from aieng_core.config import ConfigError, traceback_requested

    if traceback_requested():
        return None
    print(f"aieng: error: {exc}", file=sys.stderr)
    return EXIT_BAD_CONFIG if isinstance(exc, ConfigError) else EXIT_REFUSED


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s", stream=sys.stderr
    )
    if getattr(args, "days", 1) is not None and getattr(args, "days", 1) < 1:
        parser.error("--days must be at least 1")
    try:
        code = args.handler(args)
        sys.stdout.flush()  # here, where a closed pipe can still be answered quietly
        return code
    except BrokenPipeError:
        return _stdout_gone()
    except USER_ERRORS as exc:
        status = _refuse(exc)
        if status is None:
            raise
        return status
    except KeyboardInterrupt:
        print("aieng: interrupted", file=sys.stderr)
        return 130
