"""`aieng store verify [--gc] [--json]`: re-hash every artifact, check every ref and deployment
pointer and every bundle a pointer can roll back to, list (and with --gc remove) staging that
writers which died left behind.

Exits 1 when anything is damaged (a damaged artifact, a ref or pointer to a missing or damaged
one, a rollback target damaged or missing); stale staging alone is a warning and exits 0.

`aieng store gc [--dry-run] [--json]`: delete every artifact no root reaches (store/gc.py);
`aieng store pin ID --reason TEXT`, `unpin ID`, `pins`: the pins it keeps (store/pins.py).
`aieng store rebuild ID`: that exact artifact again, from its recorded recipe (cli/rebuild.py).
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from typing import Any

from aieng_core.cli import rebuild
from aieng_core.deploy.deployments import default_actor
from aieng_core.home import resolve_home
from aieng_core.output import emit
from aieng_core.store import ArtifactStore
from aieng_core.store.gc import collect_garbage, format_gc
from aieng_core.store.pins import pin, pins, unpin
from aieng_core.store.verify import format_verify, verify_store

ALL = "all"  # --rollback-depth all: the whole stack


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


def cmd_store_gc(args: argparse.Namespace) -> int:
    keep_days, depth = args.keep_newer_than_days, args.rollback_depth
    if keep_days is None or depth is None:
        from aieng_core.config import load_config  # pydantic: only for commands that read the config

        section = load_config(args.config).store
        keep_days = section.gc_keep_newer_than_days if keep_days is None else keep_days
        depth = section.gc_rollback_depth if depth is None else depth
    result = collect_garbage(
        resolve_home(args.home),
        dry_run=args.dry_run,
        keep_newer_than=dt.timedelta(days=keep_days),
        rollback_depth=None if depth == ALL else depth,
        on_wait=lambda: print("aieng: waiting for writers to publish (the store's gc lock)", file=sys.stderr),
    )
    emit(result, args.json, format_gc)
    return 0


def _format_pin(record: dict[str, Any]) -> str:
    return f"{record['kind']} {record['id']}: pinned by {record['actor']} at {record['pinned_at']}: {record['reason']}"


def cmd_store_pin(args: argparse.Namespace) -> int:
    record = pin(ArtifactStore(resolve_home(args.home)), args.artifact_id, args.reason, default_actor())
    emit(record, args.json, lambda r: "pinned " + _format_pin(r))
    return 0


def cmd_store_unpin(args: argparse.Namespace) -> int:
    record = unpin(resolve_home(args.home), args.artifact_id)
    emit(record, args.json, lambda r: "unpinned " + _format_pin(r))
    return 0


def cmd_store_pins(args: argparse.Namespace) -> int:
    found = pins(resolve_home(args.home))
    emit({"pins": found}, args.json, lambda r: "\n".join(_format_pin(p) for p in r["pins"]) or "no pins")
    return 0


def _non_negative_days(value: str) -> float:
    try:
        days = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of days: {value!r}") from None
    if not days >= 0 or days == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number of days, at least 0: {value!r}")
    return days


def _depth(value: str) -> int | str:
    if value == ALL:
        return ALL
    if not value.isdigit():
        raise argparse.ArgumentTypeError(f"expected a number of stack entries (0 or more) or 'all': {value!r}")
    return int(value)


def add_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    store = commands.add_parser(
        "store", help="the artifact store: verify it, collect what crashed writers left, delete what nothing reaches"
    )
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

    gc = store_commands.add_parser(
        "gc",
        help="delete every artifact no root reaches (pointers, rollback stacks, pins, refs, recent ones)",
        description="Delete every artifact that no root reaches: every deployment pointer's current bundle and "
        "its rollback stack, every pin, every current ref, every artifact newer than the configured age, each "
        "with everything its manifest reaches down to the raw snapshots. Artifacts a live writer or server "
        "holds are kept (listed as held). Each deletion is atomic: a kill leaves whole artifacts.",
    )
    gc.add_argument(
        "--dry-run", action="store_true", help="list what would be deleted and the bytes freed; delete nothing"
    )
    gc.add_argument(
        "--keep-newer-than-days",
        type=_non_negative_days,
        metavar="DAYS",
        help="keep artifacts created less than DAYS ago (default: store.gc_keep_newer_than_days)",
    )
    gc.add_argument(
        "--rollback-depth",
        type=_depth,
        metavar="N",
        help="keep the top N bundles of each rollback stack, or 'all' (default: store.gc_rollback_depth)",
    )
    gc.add_argument("--json", action="store_true", help="one JSON document on stdout")
    gc.set_defaults(handler=cmd_store_gc)

    pin_parser = store_commands.add_parser("pin", help="keep an artifact (and all it reaches) from gc, with a reason")
    pin_parser.add_argument("artifact_id", metavar="ID", help="the artifact's id (any kind)")
    pin_parser.add_argument("--reason", required=True, help="why it must be kept (recorded with who pinned it)")
    pin_parser.add_argument("--json", action="store_true", help="one JSON document on stdout")
    pin_parser.set_defaults(handler=cmd_store_pin)

    unpin_parser = store_commands.add_parser("unpin", help="remove an artifact's pin")
    unpin_parser.add_argument("artifact_id", metavar="ID", help="the pinned artifact's id")
    unpin_parser.add_argument("--json", action="store_true", help="one JSON document on stdout")
    unpin_parser.set_defaults(handler=cmd_store_unpin)

    pins_parser = store_commands.add_parser("pins", help="list the pins")
    pins_parser.add_argument("--json", action="store_true", help="one JSON document on stdout: {pins: [...]}")
    pins_parser.set_defaults(handler=cmd_store_pins)

    rebuild.add_parser(store_commands)
