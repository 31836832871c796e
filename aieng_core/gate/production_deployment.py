"""production_deployment: the promotion gate. A serving bundle reaches production only through it.

A bundle a rollback withdrew is refused before any step (BundleWithdrawn names the rollback),
unless `allow_withdrawn` says so explicitly (recorded in the promote's history line). Then
run_gate runs seven steps in order, records each one's figures, and stops at the first
failure (GateFailed names the step, the figure, the value and the limit):

1. verify  (verify_step.py): integrity and golden outputs, inside the gate;
2. quality (quality.py): bits per byte of held-out text (both sides' validation documents),
   candidate beside the deployed model: no worse than `gate.max_quality_regression`, and
   below the unigram baseline;
3. warmup  (warmup.py): load on the serving device, cold vs warm first request, peak memory
   against the budget rule, CUDA graph capture said honestly;
4. compare (compare.py): candidate and deployed bundle served in this run, interleaved in
   fresh servers, the same requests: slower beyond `gate.max_regression` only when a
   confidence interval says so (speed_statistics.py);
5. stress  (stress.py): a real `aieng serve` under closed-loop and Poisson load, absolute
   SLOs, goodput;
6. drill   (drill.py): promote, roll back and promote again on the drill pointer under
   traffic, goldens checked after each switch, time to rollback measured;
7. promote: Deployments(home).promote (the atomic switch and its append-only history line),
   with every step's figures and the Dagster run id in the event.

A failed gate leaves production as it was (still serving). So does an inconclusive one
(GateInconclusive, a GateFailed: the stress step's SLOs broke only while other processes took
the machine's CPU, busy.py), which refuses nothing: a re-run of the same bundle gates it
afresh. Every run's report, passed, failed or inconclusive (`outcome`), is written to
$AIENG_HOME/deployments/gate-reports/ (report.py), beside a folder with the config the gate's
servers ran with and their logs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from aieng_core import asset_keys
from aieng_core.config import AiengConfig
from aieng_core.deploy.deployments import DeploymentError, Deployments, default_actor
from aieng_core.gate.compare import compare_step
from aieng_core.gate.drill import drill_step
from aieng_core.gate.quality import quality_step
from aieng_core.gate.report import (
    GateFailed,
    GateInconclusive,
    GateReport,
    GateStep,
    now_iso,
    plain,
    report_name,
    reports_dir,
    step_headline,
    write_report,
)
from aieng_core.gate.server_env import write_config
from aieng_core.gate.stress import stress_step
from aieng_core.gate.verify_step import verify_step
from aieng_core.gate.warmup import warmup_step
from aieng_core.store.file_lock import exclusive_lock
from aieng_core.store.pointers import deployments_dir

KIND = asset_keys.PRODUCTION_DEPLOYMENT
BUNDLE_KIND = asset_keys.SERVING_BUNDLE
# v3: a quality step; speed compared served, interleaved, with an interval (not against recorded
# figures); withdrawn bundles refused. v4: an open speed answer earns more rounds (compare_max_rounds).
# v5: a held-out text under gate.quality_min_text_bytes is judged in the pooled text only.
# v6: servers capture their decode step graphs at warmup; the warmup figures report them.
# v7: an SLO broken only while other processes took the CPU is inconclusive, not a failure (busy.py).
CODE_VERSION = "production_deployment-v7"
PROMOTE_REASON = "gate passed"
CANARY_REASON = "gate passed; canary rollout passed every step"
# A rollout in place of the direct promote: given promote(extra figures) -> the history event,
# it returns that event, or raises GateFailed.
Rollout = Callable[[Callable[[dict[str, Any] | None], dict[str, Any]]], dict[str, Any]]
GATE_LOCK = ".gate.lock"  # under $AIENG_HOME/deployments/: held for a whole gate

log = logging.getLogger("aieng.gate")


def promoted_by(production: Deployments) -> dict[str, Any] | None:
    """The history event that promoted what `production` serves now, or None when nothing is
    deployed or no promote did (a rollback made it current again)."""
    bundle_id = production.current()["bundle_id"]
    if bundle_id is None:
        return None
    for event in reversed(production.history()):
        if event["action"] == "promote" and event["to"] == bundle_id:
            return event
    return None


def already_serving(production: Deployments, bundle_id: str) -> dict[str, Any] | None:
    """`{sequence, since, event}` when production serves `bundle_id` now (there is nothing to
    gate: the asset and the gate both stop there), else None. `event` is the history line
    that promoted it, or None if none did (a rollback made it current again)."""
    current = production.current()
    if current["bundle_id"] != bundle_id:
        return None
    return {"sequence": current["sequence"], "since": current["updated_at"], "event": promoted_by(production)}


def not_gated_again(bundle_id: str, sequence: int) -> str:
    return f"production already serves {BUNDLE_KIND} {bundle_id} (sequence {sequence}): nothing to gate"


def run_gate(
    home: Path | str,
    config: AiengConfig,
    bundle_id: str,
    run_id: str | None = None,
    actor: str | None = None,
    logger: Any = log,
    allow_withdrawn: bool = False,
    rollout: Rollout | None = None,
) -> GateReport:
    """Gate `bundle_id` (a serving_bundle in the store of `home`) and promote it on production
    when every step passes; with `rollout`, the last step is that instead of a direct promote:
    `rollout(promote)` (a canary, gate/canary.py) calls `promote(figures)` itself once the
    bundle has earned it, or raises GateFailed. Raises GateFailed (production untouched;
    `.report` holds the figures and where they were written), or DeploymentError when
    production already serves the bundle (nothing to gate).

    One gate at a time per home: gates share the drill pointer, and a second one's load
    would be measured in the first one's figures. A second gate waits for the first (each
    is bounded in time), then finds out whether there is still anything to gate."""
    home = Path(home)

    def waiting() -> None:
        logger.info(f"gate {bundle_id}: another gate is running on {home}; waiting for it to finish")

    with exclusive_lock(deployments_dir(home) / GATE_LOCK, on_wait=waiting):
        return _run_gate(home, config, bundle_id, run_id, actor, logger, allow_withdrawn, rollout)


def _run_gate(
    home: Path,
    config: AiengConfig,
    bundle_id: str,
    run_id: str | None,
    actor: str | None,
    logger: Any,
    allow_withdrawn: bool,
    rollout: Rollout | None = None,
) -> GateReport:
    production = Deployments(home)
    artifact = production.store.get(BUNDLE_KIND, bundle_id)
    serving = already_serving(production, bundle_id)
    if serving is not None:
        raise DeploymentError(not_gated_again(bundle_id, serving["sequence"]))
    if not allow_withdrawn:
        production.refuse_withdrawn(bundle_id)  # before any step: minutes of gating for a certain refusal
    current = production.current()  # what the gate measures against, and must find again to promote
    actor = actor or default_actor()
    report = GateReport(
        bundle_id=bundle_id,
        bundle_path=str(artifact.path),
        run_id=run_id,
        actor=actor,
        started_at=now_iso(),
        production_before={"bundle_id": current["bundle_id"], "sequence": current["sequence"]},
    )
    work_dir = reports_dir(home) / report_name(bundle_id, report.started_at, run_id)
    work_dir.mkdir(parents=True, exist_ok=True)
    config_path = write_config(config, work_dir / "config.yaml")
    write_report(home, report)  # a gate in progress is findable too
    logger.info(f"gate {bundle_id}: started (production serves {current['bundle_id'] or 'nothing'}); {report.path}")

    deployed = current["bundle_id"]
    steps: list[tuple[str, Callable[[], dict[str, Any]]]] = [
        ("verify", lambda: verify_step(artifact.path, bundle_id)),
        ("quality", lambda: quality_step(artifact.path, production.store, deployed, config)),
        ("warmup", lambda: warmup_step(artifact.path, config)),
        (
            "compare",
            lambda: compare_step(home, artifact.path, production.store, deployed, config, config_path, work_dir),
        ),
        ("stress", lambda: stress_step(home, artifact.path, config, config_path, work_dir)),
        ("drill", lambda: drill_step(home, bundle_id, config, config_path, work_dir, actor, run_id)),
    ]
    for name, run in steps:
        started = time.perf_counter()
        try:
            figures = run()
        except GateFailed as exc:
            _fail(home, report, exc, started, logger)
        except Exception as exc:
            failure = GateFailed(name, "error", f"{type(exc).__name__}: {exc}")
            _fail(home, report, failure, started, logger, cause=exc)
        report.steps.append(GateStep(name, True, time.perf_counter() - started, plain(figures)))
        write_report(home, report)
        headline = step_headline(name, report.steps[-1].figures)
        logger.info(f"gate {bundle_id}: {name} passed in {report.steps[-1].seconds:.1f} s: {headline}")

    started = time.perf_counter()
    now = production.current()
    if now["sequence"] != current["sequence"]:
        _fail(
            home,
            report,
            GateFailed(
                "promote",
                "production_sequence",
                f"production changed while the gate ran (now {now['bundle_id']}); the candidate was compared with "
                "and drilled against another bundle: run the gate again",
                value=now["sequence"],
                limit=current["sequence"],
            ),
            started,
            logger,
        )
    figures = {
        **report.figures(),
        "gate": {
            "code_version": CODE_VERSION,
            "report": report.path,
            "config_sha256": config.section_sha256("serving", "gate", "benchmark"),
            "step_seconds": {step.name: step.seconds for step in report.steps},
        },
    }

    def promote(extra: dict[str, Any] | None = None) -> dict[str, Any]:
        # Verified by the first step (the bundle is immutable); the pointer must still be where the
        # gate found it, checked under the pointer's lock, so a rollback made meanwhile stands.
        return production.promote(
            bundle_id,
            actor=actor,
            reason=PROMOTE_REASON if rollout is None else CANARY_REASON,
            figures=plain({**figures, **(extra or {})}),
            dagster_run_id=run_id,
            verify=False,
            expected_sequence=current["sequence"],
            allow_withdrawn=allow_withdrawn,
        )

    try:
        event = promote() if rollout is None else rollout(promote)
    except DeploymentError as exc:
        _fail(home, report, GateFailed("promote", "promote", str(exc)), started, logger)
    except GateFailed as exc:
        _fail(home, report, exc, started, logger)
    report.steps.append(
        GateStep(
            "promote",
            True,
            time.perf_counter() - started,
            {"sequence": event["sequence"], "from": event["from"], "to": event["to"], "time": event["time"]},
        )
    )
    report.event = event
    report.conclude()
    write_report(home, report)
    logger.info(
        f"gate {bundle_id}: passed; production now serves it (sequence {event['sequence']}, was {event['from']})"
    )
    return report


def _fail(
    home: Path,
    report: GateReport,
    failure: GateFailed,
    started: float,
    logger: Any,
    cause: BaseException | None = None,
) -> NoReturn:
    """Record the step that stopped the gate, write the report, raise `failure` (never returns)."""
    report.steps.append(GateStep(failure.step, False, time.perf_counter() - started, plain(failure.figures)))
    report.conclude(failure)
    write_report(home, report)
    failure.report = report
    line = f"gate {report.bundle_id}: {failure} (report: {report.path}); production unchanged"
    # An inconclusive gate is no error of the bundle's: said at info level (`aieng deploy gate`
    # prints its own one line; the Dagster asset warns and retries).
    (logger.info if isinstance(failure, GateInconclusive) else logger.error)(line)
    raise failure from cause
