"""`aieng deploy canary BUNDLE_ID --steps 5,25,100 --hold 10m`: the gate's checks, then a
gradual rollout that promotes the bundle only once it has held its SLOs at every step.

run_gate (production_deployment.py) runs its steps first (verify, quality, warmup, compare,
stress, drill), then, in place of its direct promote, the rollout below:

1. For each step's share, `canary.json` names the candidate and its share (deploy/canary.py);
   every server following the pointer loads it beside what it serves and sends it that share
   of the generation requests, by request id (sticky).
2. The step's window opens when the share is written. Each poll reads the request log: the
   candidate's requests, errors and P99 latency against production's, both over that window.
   Once the candidate has `min_requests`, a breach (CanaryPolicy, deploy/canary.py) rolls the
   canary back at once: `canary.json` is removed (servers stop routing to it within a poll),
   the reason and figures go to `canary-history.jsonl` and the gate report, and the gate
   fails with production untouched. A step passes after `hold` seconds with no breach.
3. A candidate that answers nothing within `first_answer_s` (no server follows the pointer,
   or every one refused the bundle) or too little to judge by three holds is rolled back too:
   a rollout never promotes what it could not watch.
4. After the last step (100%), the bundle is promoted through the gate's promote (the
   pointer's own promote, which the servers then follow: the candidate's replica becomes
   production's), and the canary state is removed.

At 100% production answers nothing, so the last step is judged against production's figures
of the step before: hence the first step must be below 100.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from aieng_core.deploy.canary import CanaryPolicy, WindowFigures, judge, log_size, now_iso, read_window, record_event
from aieng_core.deploy.deployments import DeploymentError, Deployments
from aieng_core.gate.report import GateFailed
from aieng_core.store.canary_state import clear_canary, read_canary, write_canary

log = logging.getLogger("aieng.gate")

STEP = "canary"
POLL_S = 0.25
FIRST_ANSWER_S = 120.0


def refuse_canary(home: Path, pointer: str, steps: Sequence[float]) -> None:
    """Refusals known before the gate runs (minutes of checks for a certain refusal)."""
    running = read_canary(home, pointer)
    if running is not None:
        raise DeploymentError(
            f"a canary rollout of {running['bundle_id']} already runs on {pointer} (step {running.get('step')}, "
            f"{running['share']:.0%}); wait for it, or stop it (its process), which removes it"
        )
    if steps[0] >= 1.0:
        raise DeploymentError("the first step must be below 100%: the candidate is compared with production there")
    if Deployments(home, pointer).current()["bundle_id"] is None:
        raise DeploymentError(
            f"nothing is deployed on {pointer}: a canary needs a bundle to compare with (`aieng deploy gate` "
            "promotes a first one)"
        )


def canary_rollout(
    home: Path,
    pointer: str,
    bundle_id: str,
    steps: Sequence[float],
    hold_s: float,
    log_path: Path,
    actor: str,
    policy: CanaryPolicy = CanaryPolicy(),
    logger: Any = log,
    poll_s: float = POLL_S,
    first_answer_s: float = FIRST_ANSWER_S,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> Callable[[Callable[[dict[str, Any] | None], dict[str, Any]]], dict[str, Any]]:
    """The rollout run_gate runs in place of its promote (its `rollout`)."""

    def rollout(promote: Callable[[dict[str, Any] | None], dict[str, Any]]) -> dict[str, Any]:
        production = Deployments(home, pointer)
        current = production.current()
        baseline_id = current["bundle_id"]
        if baseline_id is None:
            raise GateFailed(STEP, "production", f"nothing is deployed on {pointer} to compare the candidate with")
        offset = log_size(log_path)
        state = {
            "bundle_id": bundle_id,
            "share": 0.0,
            "step": 0,
            "steps": list(steps),
            "started_at": now_iso(),
            "updated_at": now_iso(),
            "actor": actor,
            "pointer_sequence": current["sequence"],
            "production": baseline_id,
        }
        record_event(home, pointer, {"action": "start", "bundle_id": bundle_id, "production": baseline_id,
                                     "steps": list(steps), "hold_s": hold_s, "actor": actor})  # fmt: skip
        done: list[dict[str, Any]] = []
        promoted = False
        try:
            last_baseline: WindowFigures | None = None
            for number, share in enumerate(steps, 1):
                write_canary(home, pointer, {**state, "share": share, "step": number, "updated_at": now_iso()})
                logger.info(f"canary {bundle_id}: step {number} of {len(steps)}, {share:.0%} of the traffic")
                figures = watch_step(
                    log_path, offset, bundle_id, baseline_id, share, hold_s, policy, last_baseline,
                    poll_s, first_answer_s, clock, sleep,
                )  # fmt: skip
                figures["step"] = number
                done.append(figures)
                if figures.get("breach"):
                    rolled_back(home, pointer, bundle_id, figures, done, logger)
                if figures["production"]["requests"] >= policy.min_requests:
                    last_baseline = WindowFigures(
                        **{k: figures["production"][k] for k in ("requests", "errors", "p99_ms")}
                    )
                record_event(home, pointer, {"action": "step", "bundle_id": bundle_id, **figures})
                logger.info(f"canary {bundle_id}: step {number} ({share:.0%}) held: {_summary(figures)}")
            event = promote({"canary": {"steps": done, "hold_s": hold_s, "policy": vars(policy)}})
            promoted = True
            record_event(home, pointer, {"action": "promoted", "bundle_id": bundle_id, "sequence": event["sequence"]})
            return event
        except GateFailed:
            raise
        except BaseException as exc:
            if not promoted:
                record_event(home, pointer, {"action": "aborted", "bundle_id": bundle_id, "steps": done,
                                             "reason": f"{type(exc).__name__}: {exc}"})  # fmt: skip
            raise
        finally:
            clear_canary(home, pointer)

    return rollout


def watch_step(
    log_path: Path,
    offset: int,
    bundle_id: str,
    baseline_id: str,
    share: float,
    hold_s: float,
    policy: CanaryPolicy,
    last_baseline: WindowFigures | None,
    poll_s: float,
    first_answer_s: float,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
) -> dict[str, Any]:
    """One step's figures once it held for `hold_s`, or with `breach` (why) as soon as one is seen."""
    since = clock()
    while True:
        sleep(poll_s)
        elapsed = clock() - since
        window = read_window(log_path, since, [bundle_id, baseline_id], offset)
        candidate, production = window[bundle_id], window[baseline_id]
        baseline = production if production.requests >= policy.min_requests else last_baseline
        figures: dict[str, Any] = {
            "share": share,
            "seconds": round(elapsed, 3),
            "candidate": candidate.as_dict(),
            "production": production.as_dict(),
            "compared_with": "this window" if baseline is production else "the previous step's window",
        }
        if candidate.requests == 0 and elapsed > first_answer_s:
            return {**figures, "breach": f"the candidate answered no request in {first_answer_s:g} s: no server "
                    "follows the pointer, or every one refused the bundle (its log says why)"}  # fmt: skip
        if candidate.requests >= policy.min_requests:
            if baseline is None:
                if elapsed >= 3 * hold_s:
                    return {**figures, "breach": f"production answered {production.requests} requests in the "
                            f"window, fewer than the {policy.min_requests} it takes to compare with"}  # fmt: skip
                continue
            why = judge(candidate, baseline, policy)
            if why is not None:
                return {**figures, "breach": why}
            if elapsed >= hold_s:
                return figures
        elif elapsed >= 3 * hold_s:
            return {**figures, "breach": f"the candidate answered {candidate.requests} requests in "
                    f"{elapsed:.0f} s, fewer than the {policy.min_requests} it takes to judge"}  # fmt: skip


def rolled_back(
    home: Path, pointer: str, bundle_id: str, figures: dict[str, Any], done: list[dict[str, Any]], logger: Any
) -> None:
    """Stop routing to the candidate at once, record why, fail the gate."""
    clear_canary(home, pointer)
    why = figures["breach"]
    record_event(home, pointer, {"action": "rolled_back", "bundle_id": bundle_id, "reason": why, "steps": done})
    logger.error(f"canary {bundle_id}: rolled back at step {figures['step']} ({figures['share']:.0%}): {why}")
    raise GateFailed(STEP, "slo", why, figures={"steps": done})


def _summary(figures: dict[str, Any]) -> str:
    candidate, production = figures["candidate"], figures["production"]

    def side(numbers: dict[str, Any]) -> str:
        p99 = "-" if numbers["p99_ms"] is None else f"{numbers['p99_ms']:.1f} ms"
        return f"{numbers['requests']} requests, {numbers['error_rate']:.2%} errors, P99 {p99}"

    return f"candidate {side(candidate)}; production {side(production)}"
