"""`aieng doctor [--json]`: what this machine has against what the configured model and serving
limits need, one verdict per line; exit 1 when the configuration cannot run here."""

from __future__ import annotations

import argparse

from aieng_core.home import resolve_home
from aieng_core.output import emit

EXIT_CANNOT_RUN = 1


def cmd_doctor(args: argparse.Namespace) -> int:
    from aieng_core.config import load_config
    from aieng_core.doctor.checks import format_report, inventory, needs_of, report

    result = report(inventory(resolve_home(args.home)), needs_of(load_config(args.config)))
    emit(result, args.json, format_report)
    return 0 if result["ok"] else EXIT_CANNOT_RUN


def add_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "doctor",
        help="this machine (cores, memory, disk under AIENG_HOME, CUDA devices, the C++ compiler, libraries) "
        "against what the configuration needs",
        description="One line per resource with a verdict (ok, warn, fail): what this machine has against what "
        "the configured model and serving limits need (memory: weights x 1.3 + 2 GiB plus the KV-cache pool). "
        "Exit 1 when the configuration cannot run here.",
    )
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")
    parser.set_defaults(handler=cmd_doctor)
