"""`aieng deploy status|promote BUNDLE_ID|rollback|check-rollback`: the deployment pointer from
the command line.

`add_parsers(commands)` adds the `deploy` command to the `aieng` parser; each handler
takes the parsed arguments (the global `--home` among them) and returns the exit code.
Every `--json` output is one JSON document on stdout: the pointer's status
(`{pointer, sequence, current, previous, stack, withdrawn, history, unapplied, torn_tail}`),
plus the `event` recorded for promote and rollback; check-rollback's is the readiness check's
result. A refusal prints one line on stderr and exits 1, with nothing on stdout. An inconclusive
gate (`aieng deploy gate`, `aieng deploy canary`: the machine was too busy for the stress step's
SLOs to say anything of the bundle) prints one line and exits 75, EX_TEMPFAIL: try again later.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aieng_core.deploy.dagster_events import tell_dagster
from aieng_core.deploy.deployments import Deployments
from aieng_core.deploy.withdrawn import ALLOW_FLAG
from aieng_core.home import resolve_home
from aieng_core.output import emit
from aieng_core.store.pointers import PRODUCTION

if TYPE_CHECKING:  # the gate imports the engine: loaded only by the commands that run it
    from aieng_core.gate.report import GateReport

HISTORY_SHOWN = 10
# sysexits.h EX_TEMPFAIL, "try again later": the gate decided nothing (a busy machine), production
# unchanged and the bundle not refused. A script tells it from a refusal (1) and runs the gate again.
EXIT_INCONCLUSIVE = 75
GATE_EXIT_STATUS = (
    "Exit status: 0 passed (production now serves the bundle); 1 refused (a step failed, or nothing to gate): "
    "production unchanged; 75 inconclusive: a stress SLO broke only while other processes took the machine's CPU "
    "(gate.busy_cores_limit), so nothing was decided: production unchanged, the bundle not refused; run the gate "
    "again when the machine is quieter."
)


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split("\n"))


def _refused(exc: Exception) -> int:
    print(f"aieng: error: {_one_line(exc)}", file=sys.stderr)
    return 1


def _deployments(args: argparse.Namespace) -> Deployments:
    return Deployments(resolve_home(args.home), args.pointer)


def _event_line(event: dict[str, Any], unapplied: bool = False) -> str:
    what = f"{event['from'] or '(none)'} -> {event['to'] or '(none)'}"
    line = f"  #{event['sequence']:<4} {event['time']}  {event['action']:<8} {what}  by {event['actor']}"
    if event["reason"]:
        line += f": {event['reason']}"
    if unapplied:
        line += "  [unapplied: the change never reached current.json]"
    return line


def format_status(status: dict[str, Any]) -> str:
    current, previous = status["current"], status["previous"]
    lines = [f"deployment pointer {status['pointer']} (sequence {status['sequence']})"]
    if current is None:
        lines.append("  current:  (no bundle deployed)")
    else:
        lines.append(f"  current:  {current['bundle_id']} since {current['since']}")
        missing = "" if current["in_store"] else "  [not in the store: it cannot be served]"
        lines.append(f"            {current['bundle_path']}{missing}")
    if previous is None:
        lines.append("  previous: (none: nothing to roll back to)")
    else:
        missing = "" if previous["in_store"] else "  [not in the store: a rollback is refused]"
        lines.append(f"  previous: {previous['bundle_id']} (a rollback makes it current again){missing}")
        integrity = previous["integrity"]
        if integrity not in ("ok", "missing"):
            integrity = f"DAMAGED: {integrity} (a rollback is refused)"
        lines.append(f"            files: {integrity}")
        lines.append(f"            readiness check: {_check_summary(previous['rollback_check'])}")
    if status["withdrawn"]:
        lines.append(f"withdrawn (a promote refuses them unless {ALLOW_FLAG}):")
        for item in status["withdrawn"]:
            reason = f": {item['reason']}" if item["reason"] else ""
            by = f"the rollback #{item['sequence']} at {item['time']} by {item['actor']}"
            lines.append(f"  {item['bundle_id']} by {by}{reason}")
    history = status["history"]
    shown = history[-HISTORY_SHOWN:]
    if not history:
        lines.append("history: empty")
    else:
        earlier = f", the last {len(shown)} shown" if len(shown) < len(history) else ""
        lines.append(f"history: {len(history)} changes{earlier}")
        unapplied = set(status["unapplied"])
        lines += [_event_line(event, event["sequence"] in unapplied) for event in shown]
    if status["torn_tail"] is not None:
        torn = status["torn_tail"]
        lines.append(
            f"  warning: line {torn['line']} of the history is incomplete ({torn['bytes']} bytes): "
            "a crash cut an append short; it is no record (the next change moves it aside)"
        )
    canary = status.get("canary")
    if canary is not None:
        lines.append(
            f"canary: {canary['bundle_id']} answers {canary['share']:.0%} of the requests "
            f"(step {canary.get('step')} of {len(canary.get('steps', []))}, since {canary.get('started_at')})"
        )
    last = next((e for e in reversed(status.get("canary_history", [])) if e["action"] != "step"), None)
    if last is not None:
        why = f": {last['reason']}" if last.get("reason") else ""
        lines.append(f"last canary event: {last['time']} {last['action']} {last['bundle_id']}{why}")
    return "\n".join(lines)


def _check_summary(check: dict[str, Any] | None) -> str:
    if check is None:
        return "never run (`aieng deploy check-rollback` runs it)"
    stale = "  [stale: the pointer changed since; run it again]" if check["stale"] else ""
    if check["ok"]:
        return f"ready at {check['checked_at']} ({check['goldens_checked']} goldens replayed){stale}"
    if check["ok"] is None:
        return f"nothing to roll back to at {check['checked_at']}{stale}"
    problem = check["problems"][0] if check["problems"] else "not ready"
    return f"NOT READY at {check['checked_at']}: {problem}{stale}"


def _format_change(result: dict[str, Any]) -> str:
    event = result["event"]
    verb = "promoted" if event["action"] == "promote" else "rolled back"
    head = f"{verb} {result['pointer']}: {event['from'] or '(none)'} -> {event['to'] or '(none)'}"
    return f"{head} (sequence {event['sequence']})\n" + format_status(result)


def cmd_deploy_status(args: argparse.Namespace) -> int:
    try:
        status = _deployments(args).status()
    except (ValueError, OSError) as exc:  # refusals, and a state dir we may not write
        return _refused(exc)
    emit(status, args.json, format_status)
    return 0


def _changed(deployments: Deployments, event: dict[str, Any], as_json: bool) -> int:
    """Report a change that was made: Dagster first (its UI names what the pointer names), then
    the status after it. The change stands whatever happens here: a status that cannot be read
    now is a warning, never a refusal."""
    tell_dagster(event, deployments.pointer)
    try:
        result = {"event": event, **deployments.status()}
    except (ValueError, OSError) as exc:
        emit({"event": event}, as_json, lambda r: _event_line(r["event"]))
        print(
            f"aieng: warning: {deployments.pointer} changed (sequence {event['sequence']}), but its status cannot "
            f"be read now: {exc}",
            file=sys.stderr,
        )
        return 0
    emit(result, as_json, _format_change)
    return 0


def cmd_deploy_promote(args: argparse.Namespace) -> int:
    try:
        deployments = _deployments(args)
        event = deployments.promote(args.bundle_id, reason=args.reason, allow_withdrawn=args.allow_withdrawn)
    except (ValueError, OSError) as exc:  # refusals, and a state dir we may not write
        return _refused(exc)
    return _changed(deployments, event, args.json)


def cmd_deploy_rollback(args: argparse.Namespace) -> int:
    try:
        deployments = _deployments(args)
        event = deployments.rollback(reason=args.reason, allow_empty=args.allow_empty)
    except (ValueError, OSError) as exc:  # refusals, and a state dir we may not write
        return _refused(exc)
    return _changed(deployments, event, args.json)


def format_check(result: dict[str, Any]) -> str:
    head = f"rollback target of {result['pointer']} (sequence {result['sequence']})"
    if result["bundle_id"] is None:
        return f"{head}: nothing to roll back to"
    if result["ok"]:
        return (
            f"{head}: {result['bundle_id']} is ready: re-hashed, loaded, {result['goldens_checked']} goldens "
            f"replayed in {result['seconds']:.1f} s"
        )
    lines = [f"{head}: {result['bundle_id']} is NOT READY: a rollback to it is refused"]
    return "\n".join(lines + [f"  {problem}" for problem in result["problems"]])


def cmd_deploy_check_rollback(args: argparse.Namespace) -> int:
    from aieng_core.deploy.rollback_readiness import check_rollback_target

    try:
        result = check_rollback_target(resolve_home(args.home), args.pointer)
    except (ValueError, OSError) as exc:  # a damaged pointer, and a state dir we may not write
        return _refused(exc)
    emit(result, args.json, format_check)
    if result["ok"] is False:
        print(
            f"aieng: error: {result['pointer']}'s rollback target {result['bundle_id']} is not ready: "
            f"{' '.join(result['problems'][0].split())}",
            file=sys.stderr,
        )
        return 1
    return 0


def _format_gate(report: dict[str, Any]) -> str:
    from aieng_core.gate.report import step_headline

    outcome = str(report["outcome"] or "unfinished").upper()
    lines = [f"gate of serving_bundle {report['bundle_id']}: {outcome}"]
    for step in report["steps"]:
        if step["passed"]:
            headline = step_headline(step["name"], step["figures"])
            lines.append(
                f"  {step['name']:<8} passed in {step['seconds']:.1f} s" + (f": {headline}" if headline else "")
            )
    if report["failure"] is not None:
        lines.append(f"  {report['failure']['step']:<8} {outcome}: {report['failure']['message']}")
    if report["event"] is not None:
        event = report["event"]
        lines.append(
            f"promoted production: {event['from'] or '(none)'} -> {event['to']} (sequence {event['sequence']})"
        )
    lines.append(f"report: {report['path']}")
    return "\n".join(lines)


def cmd_deploy_gate(args: argparse.Namespace) -> int:
    """The promotion gate from the command line: what production_deployment runs in Dagster."""
    from aieng_core.asset_keys import SERVING_BUNDLE as BUNDLE_KIND
    from aieng_core.config import load_config
    from aieng_core.gate.production_deployment import run_gate
    from aieng_core.store import ArtifactStore

    home = resolve_home(args.home)

    def gate() -> GateReport:
        bundle_id = args.bundle_id or ArtifactStore(home).require_current(BUNDLE_KIND).id
        return run_gate(home, load_config(args.config), bundle_id, allow_withdrawn=args.allow_withdrawn)

    return _answer_gate(args, gate)


def _answer_gate(args: argparse.Namespace, gate: Callable[[], GateReport]) -> int:
    """Run `gate` (a gate, or a canary through the gate) and answer as `aieng deploy gate`
    does: its report, and Dagster told of the promote; a failure's report (with --json) and
    one line on stderr, exit 1; an inconclusive gate's the same, exit 75; a refusal before any
    step, one line, exit 1."""
    from aieng_core.gate.report import GateFailed, GateInconclusive

    try:
        report = gate().as_dict()
    except GateFailed as exc:
        if exc.report is None:
            return _refused(exc)
        if args.json:
            emit(exc.report.as_dict(), True, _format_gate)
        where = f"(report: {exc.report.path}); production unchanged"
        if isinstance(exc, GateInconclusive):
            print(f"aieng: {_one_line(exc)} {where}; run the gate again", file=sys.stderr)
            return EXIT_INCONCLUSIVE
        print(f"aieng: error: {exc} {where}", file=sys.stderr)
        return 1
    except (ValueError, OSError, LookupError) as exc:  # refusals, a missing bundle, unwritable state
        return _refused(exc)
    emit(report, args.json, _format_gate)
    tell_dagster(report["event"], PRODUCTION)  # the gate promoted production: the Dagster UI names it too
    return 0


def cmd_deploy_canary(args: argparse.Namespace) -> int:
    """The gate's checks, then a canary rollout in place of its direct promote (gate/canary.py)."""
    from aieng_core.config import load_config
    from aieng_core.deploy.canary import CanaryPolicy, parse_duration, parse_steps
    from aieng_core.deploy.deployments import default_actor
    from aieng_core.gate.canary import canary_rollout, refuse_canary
    from aieng_core.gate.production_deployment import run_gate
    from aieng_core.store.request_log import default_request_log

    home = resolve_home(args.home)
    if args.abort:
        return _abort_canary(home, args)
    if args.bundle_id is None:
        return _refused(ValueError("aieng deploy canary: BUNDLE_ID is required (or --abort)"))
    # SIGTERM (a stopped job, a lost shell) ends the rollout as Ctrl-C does: canary.json removed, "aborted" recorded.
    signal.signal(signal.SIGTERM, _interrupted)

    def canary() -> GateReport:
        steps, hold = parse_steps(args.steps), parse_duration(args.hold)
        policy = CanaryPolicy(
            min_requests=args.min_requests,
            max_error_rate_increase=args.max_error_rate_increase,
            max_p99_ratio=args.max_p99_ratio,
            p99_slack_ms=args.p99_slack_ms,
        )
        refuse_canary(home, PRODUCTION, steps)
        log_path = Path(args.request_log) if args.request_log else default_request_log(home)
        actor = default_actor()
        rollout = canary_rollout(home, PRODUCTION, args.bundle_id, steps, hold, log_path, actor, policy)
        config = load_config(args.config)
        return run_gate(
            home, config, args.bundle_id, actor=actor, allow_withdrawn=args.allow_withdrawn, rollout=rollout
        )

    return _answer_gate(args, canary)


def _interrupted(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _abort_canary(home: Path, args: argparse.Namespace) -> int:
    """Remove a canary's state by hand (its rollout's process is gone, or must stop): the
    servers stop routing to it within a poll; a rollout still running sees it and fails."""
    from aieng_core.deploy.canary import record_event
    from aieng_core.deploy.deployments import default_actor
    from aieng_core.store.canary_state import clear_canary, read_canary

    try:
        running = read_canary(home, PRODUCTION)
    except ValueError as exc:  # damaged: removed all the same
        running = {"bundle_id": "unknown", "damaged": str(exc)}
    if running is None:
        return _refused(ValueError("no canary rollout runs on production: nothing to abort"))
    clear_canary(home, PRODUCTION)
    event = record_event(home, PRODUCTION, {"action": "aborted", "bundle_id": running["bundle_id"],
                                            "reason": f"aieng deploy canary --abort by {default_actor()}"})  # fmt: skip
    emit(event, args.json, lambda e: f"aborted the canary of {e['bundle_id']} on production")
    return 0


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--pointer",
        default=PRODUCTION,
        metavar="NAME",
        help=f"deployment pointer (default {PRODUCTION}; the gate's drill uses its own)",
    )
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")


def add_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `deploy status|promote|rollback` to the `aieng` subcommands."""
    deploy = commands.add_parser(
        "deploy", help="the deployment pointer: which serving bundle is current, promote, roll back"
    )
    deploy_commands = deploy.add_subparsers(dest="deploy_command", required=True, metavar="SUBCOMMAND")

    status = deploy_commands.add_parser("status", help="the current bundle, the previous one and the recent history")
    _common(status)
    status.set_defaults(handler=cmd_deploy_status)

    promote = deploy_commands.add_parser(
        "promote", help="verify a serving bundle (hashes, model, goldens), then make it current"
    )
    promote.add_argument("bundle_id", metavar="BUNDLE_ID", help="a serving_bundle id (`aieng bundle current`)")
    promote.add_argument("--reason", default="", metavar="TEXT", help="why, recorded in the history")
    promote.add_argument(
        ALLOW_FLAG,
        action="store_true",
        help="promote it even though a rollback withdrew it (recorded in the history, with the rollback overridden)",
    )
    _common(promote)
    promote.set_defaults(handler=cmd_deploy_promote)

    rollback = deploy_commands.add_parser(
        "rollback",
        help="verify the previous bundle (hashes, model, goldens), make it current again, and withdraw the one left",
    )
    rollback.add_argument("--reason", default="", metavar="TEXT", help="why, recorded in the history")
    rollback.add_argument(
        "--allow-empty",
        action="store_true",
        help="with no previous bundle, roll back to no bundle at all (the server then serves nothing)",
    )
    _common(rollback)
    rollback.set_defaults(handler=cmd_deploy_rollback)

    check = deploy_commands.add_parser(
        "check-rollback",
        help="check the bundle a rollback would make current (re-hash, load, replay goldens); exit 1 if not ready",
        description="Verify the rollback target (the previous bundle: re-hash its files, load its model, replay "
        "its goldens), time it, and record the result in deployments/<pointer>/rollback-check.json, which "
        "`aieng deploy status` shows. Exits 0 when it is ready or there is nothing to roll back to, 1 when not.",
    )
    _common(check)
    check.set_defaults(handler=cmd_deploy_check_rollback)

    gate = deploy_commands.add_parser(
        "gate",
        help="run the promotion gate (verify, warmup, compare, stress, drill) on a bundle, and promote it if it passes",
        description="Run the promotion gate on BUNDLE_ID (verify, quality, warmup, compare, stress, drill) and "
        f"promote it on production if every step passes. {GATE_EXIT_STATUS}",
    )
    gate.add_argument("bundle_id", nargs="?", metavar="BUNDLE_ID", help="default: the current serving_bundle")
    gate.add_argument("--json", action="store_true", help="one JSON document on stdout: the gate's report")
    gate.add_argument(
        ALLOW_FLAG,
        action="store_true",
        help="gate it even though a rollback withdrew it (the promote's history line records it)",
    )
    gate.set_defaults(handler=cmd_deploy_gate)

    canary = deploy_commands.add_parser(
        "canary",
        help="the gate's checks, then a gradual rollout to production that rolls itself back on an SLO breach",
        description="Run the gate's checks on BUNDLE_ID; then send it a growing share of production's generation "
        "requests (every server following the pointer, `aieng serve --deployment current`, routes by request id), "
        "comparing its error rate and P99 latency with production's over each step's window (from the request "
        "log). A breach removes the canary at once, records why in deployments/production/canary-history.jsonl "
        "and exits 1 with production unchanged; after the last step the bundle is promoted. The gate's exit "
        "status: 75 when its checks were inconclusive (a busy machine; no rollout started).",
    )
    canary.add_argument(
        "bundle_id", nargs="?", metavar="BUNDLE_ID", help="a serving_bundle id (`aieng bundle current`)"
    )
    canary.add_argument(
        "--abort", action="store_true", help="remove the running canary (the servers stop routing to it)"
    )
    canary.add_argument(
        "--steps", default="5,25,100", metavar="P,P,...", help="percent of traffic per step (default 5,25,100)"
    )
    canary.add_argument(
        "--hold", default="10m", metavar="DURATION", help="how long each step holds: 30s, 10m, 1h (default 10m)"
    )
    canary.add_argument("--min-requests", type=int, default=500, metavar="N",
                        help="the requests each side needs in a step before it is judged (default 500)")  # fmt: skip
    canary.add_argument("--max-error-rate-increase", type=float, default=0.01, metavar="X",
                        help="how far the candidate's error rate may exceed production's (default 0.01)")  # fmt: skip
    canary.add_argument("--max-p99-ratio", type=float, default=1.5, metavar="X",
                        help="the candidate's P99 latency at most this times production's (default 1.5)")  # fmt: skip
    canary.add_argument("--p99-slack-ms", type=float, default=5.0, metavar="MS",
                        help="plus this many milliseconds (default 5)")  # fmt: skip
    canary.add_argument("--request-log", metavar="PATH",
                        help="the servers' request log (default $AIENG_HOME/logs/requests.jsonl)")  # fmt: skip
    canary.add_argument("--json", action="store_true", help="one JSON document on stdout: the gate's report")
    canary.add_argument(ALLOW_FLAG, action="store_true", help="roll it out even though a rollback withdrew it")
    canary.set_defaults(handler=cmd_deploy_canary)
