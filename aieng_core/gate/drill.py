"""Gate step 5: the rollback drill, on a real server following a pointer of its own.

`aieng serve --deployment current --pointer drill` (the gate's home and config) serves
whatever the drill pointer names, as production's servers follow production's. The drill
pointer is first set to what production serves (nothing, on a first deployment); then, while
`gate.drill_clients` clients send light traffic (short greedy /generate requests, back to
back):

1. promote the candidate on the drill pointer, wait until the server serves it, and check
   its golden outputs over HTTP (greedy /generate of each golden prompt == golden.json);
2. roll back, and time it: rollback command -> the server serving the previous bundle, whose
   goldens must come back identical (first deployment: the pointer rolls back to no bundle,
   and readiness answers 503 with code no_deployment);
3. promote the candidate again, and check its goldens again.

No request may fail across the switches: a 503 `no_deployment` while the pointer names no
bundle is expected and counted apart; any other answer that is not a 200 is a failure.
Production's pointer is never written: its sequence and history are compared before and
after. The server is always stopped (SIGTERM, then a kill).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

from aieng_core.asset_keys import SERVING_BUNDLE as BUNDLE_KIND
from aieng_core.config import AiengConfig
from aieng_core.deploy.deployments import Deployments
from aieng_core.gate.report import GateFailed
from aieng_core.loadgen.http_client import error_code, request

DRILL_POINTER = "drill"
SWITCH_TIMEOUT_S = 120.0  # a switch the server has not picked up by then fails the drill
POLL_S = 0.02
TRAFFIC_NEW_TOKENS = 4
RETRY_PAUSE_S = 0.05  # a client answered anything but 200 waits this long before its next request
REQUEST_TIMEOUT_S = 60.0
NO_DEPLOYMENT = "no_deployment"


def serving_now(port: int) -> tuple[str | None, str | None]:
    """(bundle id served, None) when ready; (None, the 503's code) otherwise."""
    try:
        reply = request(port, "GET", "/health/ready", timeout=10)
    except OSError as exc:
        return None, f"unreachable: {exc}"
    body = reply.json_or_none()
    if reply.status == 200 and isinstance(body, dict):
        return str(body.get("bundle_id")), None
    return None, reply.error_code or f"HTTP {reply.status}"


class Traffic:
    """`clients` threads sending short greedy /generate requests back to back until stopped.
    `empty` is set while the pointer names no bundle: a 503 no_deployment sent or answered
    then is expected; any other non-200 answer is a failure."""

    def __init__(self, port: int, clients: int) -> None:
        self.port = port
        self.clients = clients
        self.empty = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.ok = 0
        self.expected_no_deployment = 0
        self.failures: list[str] = []
        self._threads = [
            threading.Thread(target=self._client, args=(n,), name=f"aieng-drill-{n}", daemon=True)
            for n in range(clients)
        ]

    def _client(self, number: int) -> None:
        sent = 0
        while not self._stop.is_set():
            prompt = f"drill client {number} request {sent}"
            body = {"prompt": prompt, "max_new_tokens": TRAFFIC_NEW_TOKENS, "temperature": 0}
            empty_when_sent = self.empty.is_set()
            sent += 1
            outcome = self._send(body, empty_when_sent)
            with self._lock:
                if outcome == "ok":
                    self.ok += 1
                elif outcome == NO_DEPLOYMENT:
                    self.expected_no_deployment += 1
                else:
                    self.failures.append(outcome)
            if outcome != "ok":
                self._stop.wait(RETRY_PAUSE_S)

    def _send(self, body: dict[str, Any], empty_when_sent: bool) -> str:
        """ "ok", NO_DEPLOYMENT (an expected 503), or what failed."""
        try:
            reply = request(self.port, "POST", "/generate", body, timeout=REQUEST_TIMEOUT_S)
        except OSError as exc:
            return f"{type(exc).__name__}: {exc}"
        status, answer = reply.status, reply.json_or_none()
        if status == 200 and isinstance(answer, dict) and isinstance(answer.get("token_ids"), list):
            return "ok"
        code = error_code(answer)
        if status == 503 and code == NO_DEPLOYMENT and (empty_when_sent or self.empty.is_set()):
            return NO_DEPLOYMENT
        message = answer["error"].get("message") if code is not None else str(answer)[:200]
        return f"HTTP {status} {code}: {message}"

    def start(self) -> Traffic:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        for thread in self._threads:
            thread.join(REQUEST_TIMEOUT_S + 5)
        with self._lock:
            return {
                "clients": self.clients,
                "requests": self.ok + self.expected_no_deployment + len(self.failures),
                "ok": self.ok,
                "expected_no_deployment": self.expected_no_deployment,
                "failed_requests": len(self.failures),
                "failure_samples": sorted(set(self.failures))[:5],
            }


def check_goldens(port: int, bundle_path: Path, phase: str, figures: dict[str, Any]) -> dict[str, Any]:
    """Greedy /generate of each golden prompt must give golden.json's token ids."""
    goldens = json.loads((bundle_path / "golden.json").read_text(encoding="utf-8"))["outputs"]
    mismatches = []
    for golden in goldens:
        body = {"prompt": golden["prompt"], "max_new_tokens": golden["max_new_tokens"], "temperature": 0}
        reply = request(port, "POST", "/generate", body, timeout=REQUEST_TIMEOUT_S)
        status, answer = reply.status, reply.json_or_none()
        got = answer.get("token_ids") if status == 200 and isinstance(answer, dict) else f"HTTP {status}"
        if got != golden["token_ids"]:
            mismatches.append({"prompt": golden["prompt"], "expected": golden["token_ids"], "got": got})
    result = {"checked": len(goldens), "matching": len(goldens) - len(mismatches), "mismatches": mismatches[:3]}
    if mismatches:
        first = mismatches[0]
        raise GateFailed(
            "drill",
            f"{phase}.goldens_matching",
            f"served greedy output differs from {bundle_path}/golden.json for {first['prompt']!r}: expected "
            f"{first['expected']}, got {first['got']}",
            value=result["matching"],
            limit=result["checked"],
            figures={**figures, phase: {**figures.get(phase, {}), "goldens": result}},
        )
    return result


def reset_drill(drill: Deployments, target: str | None, actor: str, run_id: str | None) -> int:
    """Make the drill pointer name `target` (None: no bundle); the changes it took."""
    changes = 0
    if target is None:
        for _ in range(len(drill.current()["stack"]) + 1):
            if drill.current()["bundle_id"] is None:
                break
            drill.rollback(
                actor=actor,
                reason="drill reset: production serves nothing",
                allow_empty=True,
                dagster_run_id=run_id,
                verify=False,  # a reset, served by no one yet: the drill's own rollback verifies
            )
            changes += 1
    elif drill.current()["bundle_id"] != target:
        drill.promote(
            target,
            actor=actor,
            reason="drill reset: what production serves",
            verify=False,
            dagster_run_id=run_id,
            allow_withdrawn=True,  # the drill pointer is an exercise: its own rollbacks withdraw nothing real
        )
        changes += 1
    return changes


def _production_state(production: Deployments) -> dict[str, Any]:
    current = production.current()
    return {"bundle_id": current["bundle_id"], "sequence": current["sequence"], "events": len(production.history())}


def drill_step(
    home: Path,
    candidate_id: str,
    config: AiengConfig,
    config_path: Path,
    work_dir: Path,
    actor: str,
    run_id: str | None,
) -> dict[str, Any]:
    from aieng_core.gate.server_env import server_env
    from aieng_core.loadgen.server_process import ServerProcess

    production = Deployments(home)
    drill = Deployments(home, DRILL_POINTER, store=production.store)
    before = _production_state(production)
    previous = before["bundle_id"]
    candidate_path = production.store.get(BUNDLE_KIND, candidate_id).path
    previous_path = None if previous is None else production.store.get(BUNDLE_KIND, previous).path
    figures: dict[str, Any] = {
        "pointer": DRILL_POINTER,
        "first_deployment": previous is None,
        "candidate_bundle_id": candidate_id,
        "previous_bundle_id": previous,
        "production_before": before,
    }
    figures["reset_changes"] = reset_drill(drill, previous, actor, run_id)
    figures["drill_sequence_before"] = drill.current()["sequence"]
    log_path = work_dir / "drill-server.log"
    figures["server"] = {"log": str(log_path)}
    server = ServerProcess(None, log_path, server_env(home, config_path), pointer=DRILL_POINTER)
    traffic: Traffic | None = None

    def wait_served(bundle_id: str | None, phase: str) -> float:
        """Seconds until the server serves `bundle_id` (None: readiness says no_deployment)."""
        started = time.perf_counter()
        while True:
            served, code = serving_now(server.port)
            if (bundle_id is not None and served == bundle_id) or (bundle_id is None and code == NO_DEPLOYMENT):
                return time.perf_counter() - started
            waited = time.perf_counter() - started
            exited = server.process is not None and server.process.poll() is not None
            if exited or waited > SWITCH_TIMEOUT_S:
                raise GateFailed(
                    "drill",
                    f"{phase}.seconds",
                    f"the server following the drill pointer did not serve {bundle_id or 'nothing'} "
                    f"(serving {served}, readiness {code}); server log {log_path}:\n{server.log_tail(1500)}",
                    value=waited,
                    limit=SWITCH_TIMEOUT_S,
                    figures=figures,
                )
            time.sleep(POLL_S)

    def switch(phase: str, action: str, expected: str | None, expected_path: Path | None) -> None:
        assert traffic is not None
        reason = f"gate drill of {candidate_id}: {phase}"
        started = time.perf_counter()
        if action == "promote":
            # The re-promote follows the drill's own rollback, which withdrew the candidate on
            # the drill pointer (an exercise); production's withdrawals are the gate's to check.
            drill.promote(
                candidate_id, actor=actor, reason=reason, verify=False, dagster_run_id=run_id, allow_withdrawn=True
            )
        else:
            if expected is None:
                traffic.empty.set()
            # Verified before the pointer moves, as every rollback: part of the time to roll back.
            drill.rollback(actor=actor, reason=reason, allow_empty=True, dagster_run_id=run_id, verify=True)
        command_seconds = time.perf_counter() - started
        figures[phase] = {"to": expected, "command_seconds": command_seconds}
        figures[phase]["seconds"] = command_seconds + wait_served(expected, phase)
        if expected is None:
            figures[phase]["readiness"] = f"503 {NO_DEPLOYMENT}"
        else:
            traffic.empty.clear()
            assert expected_path is not None
            figures[phase]["goldens"] = check_goldens(server.port, expected_path, phase, figures)

    try:
        with server:
            figures["server"]["live_seconds"] = server.ready_seconds
            figures["initial_seconds"] = wait_served(previous, "initial")
            traffic = Traffic(server.port, config.gate.drill_clients)
            if previous is None:
                traffic.empty.set()
            traffic.start()
            switch("promote", "promote", candidate_id, candidate_path)
            switch("rollback", "rollback", previous, previous_path)
            switch("repromote", "promote", candidate_id, candidate_path)
            figures["traffic"] = traffic.stop()
        figures["server"]["exit_code"] = server.stop()
    except RuntimeError as exc:  # the server never came up, or exited
        raise GateFailed(
            "drill",
            "server",
            f"`aieng serve --deployment current --pointer {DRILL_POINTER}` failed: {exc}",
            figures=figures,
        ) from None
    finally:
        if traffic is not None and "traffic" not in figures:
            figures["traffic"] = traffic.stop()
        server.stop()

    figures["pickup_seconds"] = figures["promote"]["seconds"]
    figures["time_to_rollback_seconds"] = figures["rollback"]["seconds"]
    figures["drill_sequence_after"] = drill.current()["sequence"]
    after = _production_state(production)
    figures["production_after"] = after
    if after != before:
        raise GateFailed(
            "drill",
            "production_sequence",
            "production's pointer changed while the drill ran (the drill never writes it: someone promoted or "
            "rolled back meanwhile); the candidate was drilled against another bundle, run the gate again",
            value=after["sequence"],
            limit=before["sequence"],
            figures=figures,
        )
    traffic_figures = figures["traffic"]
    if traffic_figures["failed_requests"]:
        raise GateFailed(
            "drill",
            "traffic.failed_requests",
            f"requests failed while the drill pointer switched: {traffic_figures['failure_samples']}",
            value=traffic_figures["failed_requests"],
            limit=0,
            figures=figures,
        )
    if traffic_figures["ok"] == 0:
        raise GateFailed(
            "drill", "traffic.ok", "no request succeeded during the drill", value=0, limit=1, figures=figures
        )
    if figures["server"]["exit_code"] != 0:
        raise GateFailed(
            "drill",
            "server.exit_code",
            f"the server did not drain and exit 0 after SIGTERM (log: {log_path})",
            value=figures["server"]["exit_code"],
            limit=0,
            figures=figures,
        )
    return figures
