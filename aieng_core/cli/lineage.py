"""`aieng lineage`: what produced an artifact (or what production serves), and what a
partition or a landed file went into.

    aieng lineage [current | ARTIFACT_ID] [--json]
    aieng lineage --affected-by PARTITION_OR_FILE [--json]
    aieng lineage --request REQUEST_ID [--request-log PATH] [--json]

Errors a user can act on (ArtifactNotFound, ValueError) are raised for aieng's main() to
print as one line.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from aieng_core import asset_keys
from aieng_core.home import resolve_home
from aieng_core.output import emit
from aieng_core.store.artifacts import ArtifactNotFound, ArtifactStore
from aieng_core.store.lineage import PRODUCTION, deployed_bundle, git_state, lineage_graph
from aieng_core.store.request_log import NO_BUNDLE, default_request_log, find_request
from aieng_core.tokenizer.tokenizer_inputs import CHANGED, CONSEQUENCE, GONE, affected_by

CURRENT = "current"
SHORT = 12  # hex digits of a commit or config hash in human output (--json has them whole)


def lineage_result(store: ArtifactStore, target: str = CURRENT) -> dict[str, Any]:
    """`{"root", "nodes"}` for an artifact id, plus `"deployment"` for `current` (the bundle
    the production pointer names)."""
    if target == CURRENT:
        bundle, deployment = deployed_bundle(store, PRODUCTION)
        return {**lineage_graph(store, bundle), "deployment": deployment}
    return lineage_graph(store, store.find(target))


def request_result(store: ArtifactStore, log_path: Path, request_id: str) -> dict[str, Any]:
    """`{"request", "request_log", "root", "nodes"}`: the request log's last record of
    `request_id` and the chain of the bundle that answered it. RequestNotLogged (a ValueError)
    when the log is missing or has no such record; ValueError when no bundle answered it;
    ArtifactNotFound when the store no longer holds the bundle."""
    record = find_request(log_path, request_id)
    bundle_id = record.get("bundle_id")
    answer = f"{record.get('method')} {record.get('path')} {record.get('status')} at {record.get('time')}"
    said = f"request {request_id} ({answer})"
    if not isinstance(bundle_id, str) or bundle_id == NO_BUNDLE:
        raise ValueError(f"{said} was answered while no bundle was served: there is no chain to show")
    try:
        bundle = store.get(asset_keys.SERVING_BUNDLE, bundle_id)
    except ArtifactNotFound as exc:
        raise ArtifactNotFound(f"{said} was answered by serving_bundle {bundle_id}, but: {exc}") from None
    graph = lineage_graph(store, bundle)
    datasets = [
        n.get("content_sha256") for n in graph["nodes"].values() if n.get("kind") == asset_keys.DATASET_MANIFEST
    ]
    # The chain's own data version, to hold the logged one against (None: the chain has none, or several).
    chain_version = datasets[0] if len(datasets) == 1 else None
    return {"request": record, "request_log": str(log_path), "chain_data_version": chain_version, **graph}


def cmd_lineage(args: argparse.Namespace) -> int:
    home = resolve_home(args.home)
    store = ArtifactStore(home)
    given = {"an artifact": args.target, "--affected-by": args.affected_by, "--request": args.request}
    chosen = [name for name, value in given.items() if value is not None]
    if len(chosen) > 1:
        raise ValueError(
            f"give one of an artifact (or `current`), --affected-by or --request, not both {' and '.join(chosen)}"
        )
    if args.request_log is not None and args.request is None:
        raise ValueError("--request-log names the log --request reads: use it with --request REQUEST_ID")
    if args.affected_by is not None:
        emit(affected_by(store, args.affected_by), args.json, format_affected)
    elif args.request is not None:
        log_path = Path(args.request_log).expanduser() if args.request_log else default_request_log(home)
        emit(request_result(store, log_path, args.request), args.json, format_request)
    else:
        emit(lineage_result(store, args.target or CURRENT), args.json, format_lineage)
    return 0


def add_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "lineage",
        help="the full upstream chain of an artifact (default: what production serves), what a "
        "partition or landed file went into, or what answered a request",
        description="Without --affected-by: the chain from an artifact (or `current`, the bundle the "
        "production deployment points at) down to the raw files' hashes. With --affected-by: every "
        "artifact built from a partition or landed file, and every deployment of them with the time "
        "intervals each served. With --request: the bundle that answered a logged request, and its chain.",
    )
    parser.add_argument(
        "target", nargs="?", default=None, metavar="current|ARTIFACT_ID", help="what to trace (default: current)"
    )
    parser.add_argument(
        "--affected-by",
        metavar="PARTITION_OR_FILE",
        help="a daily partition (YYYY-MM-DD) or the path of a landed raw file: list everything downstream, "
        "and the path through the tokenizer trained on it (with the commands that retrain it when it was "
        "trained on a replaced version)",
    )
    parser.add_argument(
        "--request",
        metavar="REQUEST_ID",
        help="a request `aieng serve` answered (its X-Request-ID): the bundle that answered it, from the "
        "request log, and that bundle's chain",
    )
    parser.add_argument(
        "--request-log",
        metavar="PATH",
        help="with --request: the server's request log (default $AIENG_HOME/logs/requests.jsonl)",
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
    details = [
        f"code {node.get('code_version') or 'not recorded'}",
        f"config {_short(node.get('config_sha256'))}",
        _git(node.get("git_commit")),
        f"dagster run {node.get('dagster_run_id') or 'none'}",
        f"created {node.get('created_at') or 'not recorded'}",
    ]
    metrics = node.get("metrics") or {}
    if "chat_template_sha256" in metrics:  # a bundle: what renders its chats' prompts
        template = metrics["chat_template_sha256"]
        details.append(f"chat template {_short(template)}" if template else "no chat template")
    return ", ".join(details)


def _title(node: dict[str, Any]) -> str:
    partition = node.get("partition")
    return f"{node.get('kind')} {node.get('id')}" + (f"  partition {partition}" if partition else "")


def format_request(result: dict[str, Any]) -> str:
    """The request as logged, the bundle that answered, then that bundle's tree."""
    record = result["request"]
    extras = [f"{record['latency_ms']} ms"] if record.get("latency_ms") is not None else []
    if record.get("finish_reason"):
        extras.append(f"finish {record['finish_reason']}")
    if record.get("completion_tokens") is not None:
        extras.append(f"{record['completion_tokens']} tokens generated")
    lines = [
        f"request {record.get('request_id')}: {record.get('method')} {record.get('path')} {record.get('status')} "
        f"at {record.get('time')}" + (f" ({', '.join(extras)})" if extras else ""),
        f"answered by serving_bundle {record.get('bundle_id')}, data version {record.get('data_version')}",
        f"  (from the request log {result['request_log']})",
    ]
    chain = result.get("chain_data_version")
    if chain is not None and chain != record.get("data_version"):
        lines.append(
            f"WARNING: the bundle's chain has the data version {chain}, not the one the response named: "
            "the dataset_manifest in this store is not the one the server read"
        )
    return "\n".join(lines) + "\n\n" + format_lineage(result)


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


def _deployment_lines(pointer: str, deployment: dict[str, Any]) -> list[str]:
    if not deployment["serving_now"]:
        state = "not serving" if pointer == PRODUCTION else f"not named by {pointer}"
    else:
        state = "SERVING NOW" if pointer == PRODUCTION else f"named by {pointer} now"
    lines = [f"  serving_bundle {deployment['bundle_id']}  {state}"]
    for interval in deployment.get("intervals") or []:
        until = (
            f"until #{interval['to_sequence']} {interval['to_time']}"
            if interval["to_time"] is not None
            else "until now (still current)"
        )
        lines.append(f"    served from #{interval['from_sequence']} {interval['from_time']} {until}")
    for event in deployment["events"]:
        lines.append(
            f"    #{event.get('sequence')} {event.get('time')} {event.get('action')} "
            f"{event.get('from') or 'none'} -> {event.get('to') or 'none'} by {event.get('actor')}: "
            f"{event.get('reason')}"
        )
    return lines


def format_via_tokenizer(result: dict[str, Any]) -> list[str]:
    """The path through each tokenizer reached (`via_tokenizer`): said outright, because it is
    why one day's file reaches every other day's tokens and the bundles built long after it."""
    lines = []
    for via in result.get("via_tokenizer") or []:
        partitions = [entry["partition"] for entry in via["trained_on"]]
        if "partition" in result["affected_by"]:
            trained = "trained on this partition"
        else:
            trained = f"trained on partition {', '.join(partitions)}, which read this file"
        bundles = via[asset_keys.SERVING_BUNDLE]
        state = "current" if via["current"] else "no longer current"
        lines.append(
            f"via bpe_tokenizer {via[asset_keys.BPE_TOKENIZER]} ({state}; "
            f"{trained}): every token id of every partition depends on it; {via['built_with_it']} artifacts were "
            f"built with it" + (f", serving bundles {', '.join(bundles)}" if bundles else ", no serving bundle")
        )
        for entry in via["trained_on"]:
            if entry["state"] == CHANGED:
                lines.append(
                    f"  it was trained on a replaced version of partition {entry['partition']}: {entry['why']}"
                )
            elif entry["state"] == GONE:
                lines.append(f"  it was trained on partition {entry['partition']}, since gone: {entry['why']}")
        if via["retrain"]:
            lines.append(f"  retrain it ({CONSEQUENCE}):")
            lines += [f"    {command}" for command in via["retrain"]]
    return lines


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
        lines.append(
            f"affected by {_describe_target(target)}: {_plural(len(artifacts), 'artifact')} "
            f"(* = current in the store: its newest build, not necessarily what serves; "
            f"SERVING NOW = what the {PRODUCTION} pointer names)"
        )
        for item in artifacts:
            serving_on = item.get("serving_on") or []
            lines.append(
                f"  {'*' if item['current'] else ' '} {item['kind']} {item['id']}"
                + (f"  partition {item['partition']}" if item["partition"] else "")
                + f"  created {item['created_at']}"
                + ("  SERVING NOW" if PRODUCTION in serving_on else "")
                + "".join(f"  (named by {p} now)" for p in serving_on if p != PRODUCTION)
            )
        lines += format_via_tokenizer(result)
        if not any(d.get("pointer", PRODUCTION) == PRODUCTION for d in deployments):
            lines.append(f"none of them was ever deployed to {PRODUCTION}")
        pointers = list(dict.fromkeys(d.get("pointer", PRODUCTION) for d in deployments))
        for pointer in pointers:
            on_pointer = [d for d in deployments if d.get("pointer", PRODUCTION) == pointer]
            lines.append(f"deployed to {pointer} ({_plural(len(on_pointer), 'bundle')}):")
            for deployment in on_pointer:
                lines += _deployment_lines(pointer, deployment)
    if result.get("unreadable"):
        lines.append(
            f"WARNING: {len(result['unreadable'])} manifests, refs or pointers could not be read; "
            "what they describe may be affected too:"
        )
        lines += [f"  {problem}" for problem in result["unreadable"]]
    return "\n".join(lines)
