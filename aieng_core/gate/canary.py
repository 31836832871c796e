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
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from aieng_core.deploy.canary import CanaryPolicy, RequestLogWindow, WindowFigures, judge, now_iso, record_event
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
        current = Deployments(home, pointer).current()
        baseline_id = current["bundle_id"]
        if baseline_id is None:
            raise GateFailed(STEP, "production", f"nothing is deployed on {pointer} to compare the candidate with")
        window = RequestLogWindow(log_path, [bundle_id, baseline_id])
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
        watch = Watch(home, pointer, state, window, policy, hold_s, poll_s, first_answer_s, clock, sleep)
        record_event(home, pointer, {"action": "start", "bundle_id": bundle_id, "production": baseline_id,
                                     "steps": list(steps), "hold_s": hold_s, "actor": actor})  # fmt: skip
        promoted = False
        try:
            for number, share in enumerate(steps, 1):
                logger.info(f"canary {bundle_id}: step {number} of {len(steps)}, {share:.0%} of the traffic")
                figures = watch.step(number, share)
                if figures.get("breach"):
                    rolled_back(home, pointer, bundle_id, figures, watch.done, logger)
                record_event(home, pointer, {"action": "step", "bundle_id": bundle_id, **figures})
                logger.info(f"canary {bundle_id}: step {number} ({share:.0%}) held: {_summary(figures)}")
            event = promote({"canary": {"steps": watch.done, "hold_s": hold_s, "policy": vars(policy)}})
            promoted = True
            record_event(home, pointer, {"action": "promoted", "bundle_id": bundle_id, "sequence": event["sequence"]})
            return event
        except GateFailed as exc:
            if exc.figure != "slo":  # an abort or a pointer moved by hand: said, then the gate fails
                record_event(home, pointer, {"action": "aborted", "bundle_id": bundle_id, "steps": watch.done,
                                             "reason": exc.reason})  # fmt: skip
            raise
        except BaseException as exc:
            if not promoted:
                record_event(home, pointer, {"action": "aborted", "bundle_id": bundle_id, "steps": watch.done,
                                             "reason": f"{type(exc).__name__}: {exc}"})  # fmt: skip
            raise
        finally:
            if read_canary_quietly(home, pointer, state["started_at"]):
                clear_canary(home, pointer)

    return rollout


def read_canary_quietly(home: Path, pointer: str, started_at: str) -> bool:
    """Whether canary.json is still this rollout's (and not another's, or an abort's)."""
    try:
        running = read_canary(home, pointer)
    except DeploymentError:
        return True  # damaged: ours to remove
    return running is not None and running.get("started_at") == started_at


class Watch:
    """One rollout's steps: the state file rewritten every second (the servers' heartbeat),
    the pointer checked at every poll, each step judged once at the end of its hold."""

    def __init__(
        self,
        home: Path,
        pointer: str,
        state: dict[str, Any],
        window: RequestLogWindow,
        policy: CanaryPolicy,
        hold_s: float,
        poll_s: float,
        first_answer_s: float,
        clock: Callable[[], float],
        sleep: Callable[[float], None],
    ) -> None:
        self.home, self.pointer, self.state, self.window, self.policy = home, pointer, state, window, policy
        self.hold_s, self.poll_s, self.first_answer_s, self.clock, self.sleep = (
            hold_s,
            poll_s,
            first_answer_s,
            clock,
            sleep,
        )
        self.bundle_id, self.baseline_id = state["bundle_id"], state["production"]
        self.done: list[dict[str, Any]] = []
        self.last_baseline: WindowFigures | None = None
        self._beat = -math.inf

    def beat(self, force: bool = False) -> None:
        """Rewrite canary.json (its updated_at) once a second; GateFailed when someone else
        changed it (`aieng deploy canary --abort`) or the pointer moved by hand."""
        now = self.clock()
        if not force:
            if not read_canary_quietly(self.home, self.pointer, self.state["started_at"]):
                raise GateFailed(STEP, "aborted", "the canary was removed while it ran (aieng deploy canary --abort)")
            sequence = Deployments(self.home, self.pointer).current()["sequence"]
            if sequence != self.state["pointer_sequence"]:
                moved = f"sequence {self.state['pointer_sequence']} -> {sequence}"
                why = f"{self.pointer} changed by hand while the canary ran ({moved}): nothing is promoted"
                raise GateFailed(STEP, "pointer_moved", why)
        if force or now - self._beat >= 1.0:
            self.state["updated_at"] = now_iso()
            write_canary(self.home, self.pointer, self.state)
            self._beat = now

    def step(self, number: int, share: float) -> dict[str, Any]:
        """The step's figures once its hold is over, with `breach` (why) when it failed."""
        self.state.update(share=share, step=number)
        self.beat(force=True)
        started = self.clock()
        self.window.forget_before(started)
        while True:
            self.sleep(self.poll_s)
            self.beat()
            self.window.poll()
            now = self.clock()
            candidate = self.window.figures(self.bundle_id, started)
            # The window opens at the candidate's first answer: loading it on the servers
            # (seconds to minutes) is no time watched.
            opened = candidate.first_arrival if candidate.first_arrival is not None else now
            production = self.window.figures(self.baseline_id, opened)
            candidate = self.window.figures(self.bundle_id, opened)
            watched = now - opened
            enough = production.requests >= self.policy.min_requests
            baseline = production if enough else self.last_baseline
            figures: dict[str, Any] = {
                "step": number,
                "share": share,
                "seconds_watched": round(watched, 3),
                "candidate": candidate.as_dict(),
                "production": production.as_dict(),
                "compared_with": "this window" if enough else "the previous step's window",
            }
            if candidate.requests == 0:
                if now - started > self.first_answer_s:
                    return self._ends({**figures, "breach": f"the candidate answered no request in "
                                       f"{self.first_answer_s:g} s: no server follows the pointer, or every one "
                                       "refused the bundle (its log says why)"})  # fmt: skip
                continue
            if watched < self.hold_s:
                continue
            if candidate.requests < self.policy.min_requests or baseline is None:
                if watched < 3 * self.hold_s:
                    continue  # a quiet hour: the step holds until it has enough to judge, up to 3 holds
                short = "the candidate" if candidate.requests < self.policy.min_requests else "production"
                counted = candidate.requests if short == "the candidate" else production.requests
                return self._ends({**figures, "breach": f"{short} answered {counted} requests in {watched:.0f} s, "
                                   f"fewer than the {self.policy.min_requests} it takes to judge"})  # fmt: skip
            why = judge(candidate, baseline, self.policy)
            if enough:
                self.last_baseline = production
            return self._ends({**figures, "breach": why} if why else figures)

    def _ends(self, figures: dict[str, Any]) -> dict[str, Any]:
        self.done.append(figures)
        return figures


def rolled_back(
    home: Path, pointer: str, bundle_id: str, figures: dict[str, Any], done: list[dict[str, Any]], logger: Any
) -> None:
    """Stop routing to the candidate at once, record why, fail the gate."""
    clear_canary(home, pointer)  # the servers stop routing to it within a poll
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
