"""`aieng store verify [--gc] [--json]`: re-hash every artifact, check every ref and deployment
pointer and every bundle a pointer can roll back to, list (and with --gc remove) staging that
writers which died left behind.

Exits 1 when anything is damaged (a damaged artifact, a ref or pointer to a missing or damaged
one, a rollback target damaged or missing); stale staging alone is a warning and exits 0.
"""

from __future__ import annotations

import argparse
import sys

from aieng_core.home import resolve_home
from aieng_core.output import emit
from aieng_core.store.verify import format_verify, verify_store


def cmd_store_verify(args: argparse.Namespace) -> int:
    result = verify_store(resolve_home(args.home), gc=args.gc)
    emit(result, args.json, format_verify)
    if not result["ok"]:
        deployed = sum(1 for entry in result["deployments"] if not entry["ok"])
        deployments = f", {deployed} deployed or rollback bundles damaged or missing" if deployed else ""
        print(
            f"aieng: error: {len(result['damaged'])} damaged artifacts, {len(result['bad_refs'])} bad refs"
            f"{deployments} in {result['home']}",
            file=sys.stderr,
        )
        return 1
    return 0


def add_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    store = commands.add_parser("store", help="the artifact store: verify it, collect what crashed writers left")
    store_commands = store.add_subparsers(dest="store_command", required=True, metavar="SUBCOMMAND")
    verify = store_commands.add_parser(
        "verify",
        help="re-hash every artifact, check every ref; list damaged artifacts and stale staging (exit 1 on damage)",
        description="Re-hash every artifact against its manifest, check that every ref and deployment pointer "
        "names an intact artifact and that every bundle a deployment pointer can roll back to (its whole stack) "
        "is in the store and intact, and list the staging directories and temporary files writers left behind, "
        "with whether a live writer still owns each. Exits 1 when anything is damaged; stale staging alone is "
        "a warning.",
    )
    verify.add_argument("--gc", action="store_true", help="remove staging that no live writer owns")
    verify.add_argument("--json", action="store_true", help="one JSON document on stdout")
    verify.set_defaults(handler=cmd_store_verify)
