"""Gate step 4: is the candidate slower than what serves? Both served, in this run, interleaved.

Each of `gate.compare_rounds` rounds starts two fresh `aieng serve --bundle` processes
(loadgen/server_process.py, the gate's config), one for the candidate and one for the
deployed bundle (which starts first alternates from round to round), warms both up, then
sends them the same `gate.compare_requests` streamed
/v1/completions requests in pairs (loadgen/http_load.py `paired`): request i to one server
and then to the other, back to back, the order alternated from pair to pair (A B, B A, ...),
from `gate.compare_concurrency` clients. The prompts are the stress step's (ignore_eos, so
both sides generate exactly the same number of tokens). Measuring the two sides moments
apart is what makes the comparison fair on a busy machine: a load that comes and goes hits
both members of a pair alike, where turns of seconds each would hand it to one side.

The decision (speed_statistics.py): the candidate fails only when the confidence interval
(`gate.compare_confidence`) of its median end-to-end latency over the deployed bundle's lies
wholly above 1 + `gate.max_regression`. When the answer is open after `gate.compare_rounds`
(the median ratio is above the limit but the interval still reaches below it, as on a saturated
machine) another round is served, up to `gate.compare_max_rounds`: more pairs narrow the
interval where it matters, and a clear answer costs nothing extra. Figures measured when the deployed bundle was
promoted, under another load, are never compared with: that was noise posing as a regression.
The absolute SLOs are the stress step's. Each round records `others_cores`, the CPU other
processes took during its pairs (gate/busy.py); unlike the stress step's, this decision does
not depend on it: a load hits both members of a pair alike, and its error rates were measured
beside a busy process (docs/deployment/promotion-gate.md).

On a first deployment there is nothing to compare with, and the figures say so. A deployed
bundle that cannot be served is production's problem (`aieng store verify` names it): it is
said in the figures and does not stop the candidate.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from aieng_core.asset_keys import SERVING_BUNDLE
from aieng_core.config import AiengConfig
from aieng_core.gate.report import GateFailed
from aieng_core.gate.speed_statistics import decide, open_question
from aieng_core.store import ArtifactIntegrityError, ArtifactNotFound, ArtifactStore

CANDIDATE, DEPLOYED = "candidate", "deployed"
SIDES = (CANDIDATE, DEPLOYED)
WARMUP_NEW_TOKENS = 2
MIN_PAIRS = 2  # per round: fewer, and there is no comparison to make

log = logging.getLogger("aieng.gate")


def _requests_for(bundle_path: Path, texts: list[tuple[str, int]]) -> list[Any]:
    """The same prompts and token budgets, with the prompt length the bundle's own tokenizer gives
    (the load generator checks it against the server's usage)."""
    from aieng_core.loadgen.http_load import LoadRequest
    from aieng_core.tokenizer.bpe import load_tokenizer

    tokenizer = load_tokenizer(bundle_path)
    return [
        LoadRequest(prompt, len(tokenizer.encode(prompt, add_special_tokens=False).ids), max_tokens)
        for prompt, max_tokens in texts
    ]


def _max_context(bundle_path: Path) -> int:
    import json

    return int(json.loads((bundle_path / "serving.json").read_text(encoding="utf-8"))["max_context"])


def _round(
    paths: dict[str, Path],
    requests: dict[str, list[Any]],
    config: AiengConfig,
    env: dict[str, str],
    logs: dict[str, Path],
    start_order: tuple[str, str],
) -> dict[str, Any]:
    """Two fresh servers, warmed up, sent the requests in pairs: per-request E2EL (ms) of each
    side, index by index, and what each server did."""
    from contextlib import ExitStack
    from dataclasses import replace

    from aieng_core.gate.busy import gate_sampler
    from aieng_core.loadgen.http_load import closed_loop, paired
    from aieng_core.loadgen.server_process import ServerProcess

    gate = config.gate
    servers = {side: ServerProcess(paths[side], logs[side], env) for side in SIDES}
    try:
        with ExitStack() as stack:
            # Which server starts (and warms up) first alternates from round to round, as the
            # order within pairs does: nothing about being first may favour one side.
            for side in start_order:
                try:
                    stack.enter_context(servers[side])
                except RuntimeError as exc:  # never ready, or exited (a damaged bundle exits on load)
                    raise ServedBadly(side, str(exc)) from None
            for side in start_order:
                warm = [replace(r, max_tokens=WARMUP_NEW_TOKENS) for r in requests[side][: gate.compare_concurrency]]
                closed_loop(servers[side].port, warm, len(warm), stream=True, max_seconds=gate.max_seconds_per_level)
            # Recorded, not judged: a load hits both members of a pair alike (gate/busy.py).
            sampler = gate_sampler(lambda: [server.pid for server in servers.values()])
            sampler.sample()
            started = time.perf_counter()
            records = paired(
                (servers[CANDIDATE].port, servers[DEPLOYED].port),
                (requests[CANDIDATE], requests[DEPLOYED]),
                gate.compare_concurrency,
                stream=True,
                max_seconds=gate.max_seconds_per_level,
            )
            wall = time.perf_counter() - started
            use = sampler.sample()
        exit_codes = {side: servers[side].stop() for side in SIDES}
    finally:
        for server in servers.values():
            server.stop()
    # Failed requests are the fault of the side that failed them, the deployed side looked at
    # first (production's trouble must not read as the candidate's). Pairs the time bound left
    # unsent are nobody's in particular: the pairs sent whole are compared.
    for side in (DEPLOYED, CANDIDATE):
        failed = [r for r in records[SIDES.index(side)] if not r.ok]
        if failed:
            errors = sorted({str(r.error) for r in failed})[:3]
            raise ServedBadly(side, f"{len(failed)} of its requests failed ({errors}); log: {logs[side]}")
    sent = len(records[0])
    if sent < MIN_PAIRS:
        raise GateFailed(
            "compare",
            "pairs_sent",
            f"only {sent} of {len(requests[CANDIDATE])} request pairs were sent within gate.max_seconds_per_level "
            f"({gate.max_seconds_per_level:g} s): too few to compare (logs: {logs[CANDIDATE]}, {logs[DEPLOYED]})",
            value=sent,
            limit=MIN_PAIRS,
        )
    others = None if use is None else use.others_cores
    measured: dict[str, Any] = {"wall_seconds": wall, "pairs_sent": sent, "others_cores": others, "sides": {}}
    for side, side_records in zip(SIDES, records):
        measured["sides"][side] = {
            "e2el_ms": [r.e2el * 1000.0 for r in side_records],
            "ready_seconds": servers[side].ready_seconds,
            "exit_code": exit_codes[side],
            "log": str(logs[side]),
        }
    return measured


class ServedBadly(RuntimeError):
    def __init__(self, side: str, message: str) -> None:
        super().__init__(message)
        self.side = side


def compare_step(
    home: Path,
    candidate_path: Path,
    store: ArtifactStore,
    deployed_id: str | None,
    config: AiengConfig,
    config_path: Path,
    work_dir: Path,
) -> dict[str, Any]:
    from aieng_core.gate.server_env import server_env
    from aieng_core.gate.stress import stress_requests

    gate = config.gate
    confidence = gate.compare_confidence
    figures: dict[str, Any] = {
        "deployed_bundle_id": deployed_id,
        "rounds": gate.compare_rounds,
        "requests_per_turn": gate.compare_requests,
        "concurrency": gate.compare_concurrency,
        "max_regression": gate.max_regression,
        "compared": False,
    }
    if deployed_id is None:
        figures["note"] = "first deployment: nothing is deployed, so there is nothing to compare with"
        return figures
    try:
        deployed_path = store.get(SERVING_BUNDLE, deployed_id).path
    except (ArtifactNotFound, ArtifactIntegrityError) as exc:
        figures["note"] = f"not compared: the deployed bundle {deployed_id} is not servable: {exc}"
        return figures
    paths = {CANDIDATE: candidate_path, DEPLOYED: deployed_path}
    # Prompts cut for the smaller context of the two, so every request fits both bundles.
    shorter = min(paths.values(), key=_max_context)
    try:
        cut = stress_requests(shorter, config, count=gate.compare_requests)
    except GateFailed as exc:  # the same requests as the stress step's: the same refusal, at this step
        raise GateFailed("compare", exc.figure, exc.reason, exc.value, exc.limit, figures=figures) from None
    texts = [(r.prompt, r.max_tokens) for r in cut]
    requests = {side: _requests_for(path, texts) for side, path in paths.items()}
    env = server_env(home, config_path)
    turns: list[dict[str, Any]] = []
    latencies: list[dict[str, list[float]]] = []
    decision: dict[str, Any] = {}
    for number in range(1, max(gate.compare_rounds, gate.compare_max_rounds) + 1):
        if number > gate.compare_rounds:
            decision = decide([(m[CANDIDATE], m[DEPLOYED]) for m in latencies], gate.max_regression, confidence)
            if not open_question(decision):  # a clear answer either way stops here
                break
            log.info(f"compare: inconclusive after {number - 1} rounds ({decision['verdict']}); one more round")
        logs = {side: work_dir / f"compare-round{number}-{side}.log" for side in SIDES}
        try:
            start_order = SIDES if number % 2 == 1 else SIDES[::-1]
            measured = _round(paths, requests, config, env, logs, start_order)
        except ServedBadly as exc:
            if exc.side == DEPLOYED:
                figures["note"] = f"not compared: the deployed bundle {deployed_id} could not be served: {exc}"
                figures["turns"] = turns
                return figures
            raise GateFailed(
                "compare", "server", f"serving the candidate failed: {exc}", figures={**figures, "turns": turns}
            ) from None
        latencies.append({side: measured["sides"][side].pop("e2el_ms") for side in SIDES})
        for side in SIDES:
            turns.append(
                {
                    "round": number,
                    "side": side,
                    "wall_seconds": measured["wall_seconds"],
                    "pairs_sent": measured["pairs_sent"],
                    "others_cores": measured["others_cores"],  # during the round's pairs
                    **measured["sides"][side],
                }
            )
    rounds = [(m[CANDIDATE], m[DEPLOYED]) for m in latencies]
    decision = decide(rounds, gate.max_regression, confidence)
    figures.update(compared=True, turns=turns, decision=decision, rounds=len(rounds))
    figures["note"] = f"candidate vs deployed {deployed_id}, served in this run: {decision['verdict']}"
    figures["e2el_ms_median"] = {
        side: _median([value for m in latencies for value in m[side]]) for side in (CANDIDATE, DEPLOYED)
    }
    if decision["regression"]:
        low = decision["interval"][0]
        raise GateFailed(
            "compare",
            "e2el_ms.median_ratio",
            f"the candidate is slower than the deployed bundle {deployed_id}: {decision['verdict']} "
            f"(gate.max_regression {gate.max_regression:.0%}, confidence {gate.compare_confidence:.0%})",
            value=low,
            limit=decision["limit"],
            figures=figures,
        )
    return figures


def _median(values: list[float]) -> float:
    import statistics

    return statistics.median(values)
