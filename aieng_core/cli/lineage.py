"""`aieng lineage`: what produced an artifact (or what production serves), and what a
partition or a landed file went into.

    aieng lineage [current | ARTIFACT_ID] [--json]
    aieng lineage --affected-by PARTITION_OR_FILE [--json]

Errors a user can act on (ArtifactNotFound, ValueError) are raised for aieng's main() to
print as one line.
"""

from __future__ import annotations

import argparse
from typing import Any

from aieng_core import asset_keys
from aieng_core.home import resolve_home
from aieng_core.output import emit
from aieng_core.store.artifacts import ArtifactStore
from aieng_core.store.lineage import PRODUCTION, affected_by, deployed_bundle, git_state, lineage_graph

CURRENT = "current"
SHORT = 12  # hex digits of a commit or config hash in human output (--json has them whole)


def lineage_result(store: ArtifactStore, target: str = CURRENT) -> dict[str, Any]:
    """`{"root", "nodes"}` for an artifact id, plus `"deployment"` for `current` (the bundle
    the production pointer names)."""
    if target == CURRENT:
        bundle, deployment = deployed_bundle(store, PRODUCTION)
        return {**lineage_graph(store, bundle), "deployment": deployment}
    return lineage_graph(store, store.find(target))


def cmd_lineage(args: argparse.Namespace) -> int:
    store = ArtifactStore(resolve_home(args.home))
    if args.affected_by is not None:
        if args.target is not None:
            raise ValueError("give either an artifact (or `current`) or --affected-by, not both")
        emit(affected_by(store, args.affected_by), args.json, format_affected)
    else:
        emit(lineage_result(store, args.target or CURRENT), args.json, format_lineage)
    return 0


def add_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "lineage",
        help="the full upstream chain of an artifact (default: what production serves), or what a "
        "partition or landed file went into",
        description="Without --affected-by: the chain from an artifact (or `current`, the bundle the "
        "production deployment points at) down to the raw files' hashes. With --affected-by: every "
        "artifact built from a partition or landed file, and every production deployment of them.",
    )
    parser.add_argument(
        "target", nargs="?", default=None, metavar="current|ARTIFACT_ID", help="what to trace (default: current)"
    )
    parser.add_argument(
        "--affected-by",
        metavar="PARTITION_OR_FILE",
        help="a daily partition (YYYY-MM-DD) or the path of a landed raw file: list everything downstream",
    )
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")
    parser.set_defaults(handler=cmd_lineage)


# ---- human output ------------------------------------------------------------------------------


def _short(value: Any) -> str:
    return value[:SHORT] if isinstance(value, str) and value else "not recorded"


def _git(value: Any) -> str:
    commit, dirty = git_state(value)
    if commit is None:
        return "git not recorded"
    return f"git {commit[:SHORT]} ({'uncommitted changes' if dirty else 'clean tree'})"


def _details(node: dict[str, Any]) -> str:
    return ", ".join(
        [
            f"code {node.get('code_version') or 'not recorded'}",
            f"config {_short(node.get('config_sha256'))}",
            _git(node.get("git_commit")),
            f"dagster run {node.get('dagster_run_id') or 'none'}",
            f"created {node.get('created_at') or 'not recorded'}",
        ]
    )


def _title(node: dict[str, Any]) -> str:
    partition = node.get("partition")
    return f"{node.get('kind')} {node.get('id')}" + (f"  partition {partition}" if partition else "")


def format_lineage(result: dict[str, Any]) -> str:
    """An indented tree, nearest first: each artifact under what was built from it, its raw
    files under each raw_documents snapshot. An artifact reached twice is shown once."""
    nodes: dict[str, dict[str, Any]] = result["nodes"]
    root = nodes[result["root"]]
    raw = [n for n in nodes.values() if n.get("kind") == asset_keys.RAW_DOCUMENTS]
    files = sum(len(n.get("sources") or []) for n in raw)
    lines = [f"lineage of {_title(root)}: {len(nodes)} artifacts, {len(raw)} raw snapshots of {files} landed files"]
    deployment = result.get("deployment")
    if deployment is not None:
        lines.append(
            f"deployed to {deployment.get('pointer') or PRODUCTION}: sequence {deployment.get('sequence')}, "
            f"updated {deployment.get('updated_at')}"
        )
        events = deployment.get("events") or []
        if events:
            last = events[-1]
            lines.append(
                f"  {last.get('action')} #{last.get('sequence')} at {last.get('time')} by {last.get('actor')}: "
                f"{last.get('reason')}"
            )
    shown: set[str] = set()

    def walk(artifact_id: str, depth: int) -> None:
        indent = "  " * depth
        node = nodes[artifact_id]
        if artifact_id in shown:
            lines.append(f"{indent}{_title(node)}  (shown above)")
            return
        shown.add(artifact_id)
        lines.append(f"{indent}{_title(node)}")
        lines.append(f"{indent}    {_details(node)}")
        lines.append(f"{indent}    {node['path']}")
        for source in node.get("sources") or [] if node.get("kind") == asset_keys.RAW_DOCUMENTS else []:
            size = source.get("size")
            lines.append(
                f"{indent}    file {source.get('path')}  "
                f"{f'{size:,}' if isinstance(size, int) else size} bytes  sha256 {source.get('sha256')}"
            )
        for item in node.get("inputs") or []:
            walk(item["id"], depth + 1)

    lines.append("")
    walk(result["root"], 0)
    return "\n".join(lines)


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _describe_target(target: dict[str, Any]) -> str:
    if "partition" in target:
        return f"partition {target['partition']}"
    state = f"sha256 {target['sha256']}" if target["exists"] else "not found: matched by its recorded path only"
    return f"file {target['file']} ({state})"


def format_affected(result: dict[str, Any]) -> str:
    target = result["affected_by"]
    artifacts, deployments = result["artifacts"], result["deployments"]
    lines = []
    if "file" in target:
        count = len(target["matches"])
        lines.append(
            f"{_describe_target(target)}: {_plural(count, 'recorded source')} {'matches' if count == 1 else 'match'}"
        )
        for match in target["matches"]:
            lines.append(
                f"  raw_documents {match['raw_documents']}  partition {match['partition']}: {match['path']} "
                f"(by {' and '.join(match['by'])})"
            )
    if not artifacts:
        if "partition" in target:
            why = "no artifact in the store was built from it"
        elif target["exists"]:
            why = "no raw_documents snapshot records that path or its sha256"
        else:
            why = "no raw_documents snapshot records that path"
        lines.append(f"nothing is affected by {_describe_target(target)}: {why}")
    else:
        lines.append(f"affected by {_describe_target(target)}: {_plural(len(artifacts), 'artifact')} (* = current)")
        for item in artifacts:
            lines.append(
                f"  {'*' if item['current'] else ' '} {item['kind']} {item['id']}"
                + (f"  partition {item['partition']}" if item["partition"] else "")
                + f"  created {item['created_at']}"
            )
        if deployments:
            lines.append(f"deployed to {PRODUCTION} ({_plural(len(deployments), 'bundle')}):")
        else:
            lines.append(f"none of them was ever deployed to {PRODUCTION}")
        for deployment in deployments:
            lines.append(
                f"  serving_bundle {deployment['bundle_id']}"
                + ("  SERVING NOW" if deployment["serving_now"] else "  not serving")
            )
            for event in deployment["events"]:
                lines.append(
                    f"    #{event.get('sequence')} {event.get('time')} {event.get('action')} "
                    f"{event.get('from') or 'none'} -> {event.get('to') or 'none'} by {event.get('actor')}: "
                    f"{event.get('reason')}"
                )
    if result.get("unreadable"):
        lines.append(
            f"WARNING: {len(result['unreadable'])} manifests or refs could not be read; "
            "what they describe may be affected too:"
        )
        lines += [f"  {problem}" for problem in result["unreadable"]]
    return "\n".join(lines)
