"""production_deployment: the promotion gate on the current serving bundle, and the switch.

The asset calls aieng_core.gate.run_gate on the current serving_bundle (verify, warmup,
compare, stress test, rollback drill on the drill pointer, promote) and turns the gate report into
metadata. A failed gate raises dg.Failure naming the step and the figure, with production
left serving what it served. An inconclusive gate (the machine was too busy for the stress
step's SLOs to say anything of the bundle: aieng_core/gate/busy.py) refuses nothing: the step
asks Dagster to run it again (dg.RetryRequested, `gate.busy_retries` times,
`gate.busy_retry_seconds` apart), and after the last retry fails with a description starting
`inconclusive:` and metadata `outcome: inconclusive`. A bundle production already serves is not gated again, and a
bundle a rollback withdrew is refused (dg.Failure naming the rollback) unless the run carries
the tag `aieng/allow_withdrawn=true` (the promote records the override in the history).

The asset check `rollback_target_ready` re-verifies what a rollback of production would make
current (re-hash, load, goldens replayed: deploy/rollback_readiness.py); the schedule
`rollback_readiness_schedule` runs it alone (orchestration/schedules.py), and it runs after
every gate run of the `deploy` job too.
"""

import re
from collections.abc import Callable
from typing import Any

import dagster as dg

from aieng_core import asset_keys
from aieng_core.deploy.deployments import DeploymentError, Deployments
from aieng_core.deploy.withdrawn import BundleWithdrawn, withdrawn_refusal
from aieng_core.gate import production_deployment as gate_core
from aieng_core.gate.report import GateInconclusive, step_headline
from aieng_core.store.pointers import PRODUCTION
from orchestration.assets.serving import serving_bundle
from orchestration.partitions import single_run
from orchestration.resources import AiengResource

# The bundle a run was requested for (orchestration/sensors.py); the gate gates the current one.
BUNDLE_ID_TAG = "aieng/serving_bundle_id"
# `true` on a run: gate (and promote) the current bundle even though a rollback withdrew it.
ALLOW_WITHDRAWN_TAG = "aieng/allow_withdrawn"

# The stress table's columns: few enough that five load levels fit the asset page's value
# column (a wider table widens the whole metadata table, and every long value in it is then cut
# at the page's edge). Every other figure of each level is in `figures`.
LEVEL_COLUMNS = (
    ("errors", "errors"),
    ("429", "rejected_429"),
    ("P99 TTFT ms", ("ttft_ms", "p99")),
    ("P99 E2EL ms", ("e2el_ms", "p99")),
    ("tok/s", "output_throughput"),
)
# Per load level, the figures that get a numeric row of their own (plotted gate run after gate run).
LEVEL_NUMBERS = (("ttft_p99_ms", ("ttft_ms", "p99")), ("e2el_p99_ms", ("e2el_ms", "p99")))
VERDICT_CHARS = 120  # one line on the asset page


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def _get(figures: dict[str, Any], path: str | tuple[str, ...]) -> Any:
    value: Any = figures
    for key in (path,) if isinstance(path, str) else path:
        value = value.get(key) if isinstance(value, dict) else None
    return value


def steps_table(steps: list[dict[str, Any]], stopped: str = "failed: see failed_figure") -> str:
    """One row per step run: passed, seconds, what it found (the gate's own headline); `stopped`
    for the step that stopped the gate."""
    rows = ["| step | passed | seconds | found |", "|---|---|---|---|"]
    for step in steps:
        found = step_headline(step["name"], step["figures"]) if step["passed"] else stopped
        rows.append(f"| {step['name']} | {step['passed']} | {step['seconds']:.2f} | {_cell(found)} |")
    return "\n".join(rows)


def levels_table(levels: dict[str, dict[str, Any]]) -> str:
    """The stress test, one row per load level (loadgen/stats.py definitions)."""
    header = "| level | " + " | ".join(name for name, _ in LEVEL_COLUMNS) + " |"
    rows = [header, "|---" * (len(LEVEL_COLUMNS) + 1) + "|"]
    for name, figures in levels.items():
        cells = [_cell(_get(figures, path)) for _, path in LEVEL_COLUMNS]
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _step_figures(steps: list[dict[str, Any]], name: str) -> dict[str, Any]:
    figures = next((step.get("figures") for step in steps if step.get("name") == name), None)
    return figures if isinstance(figures, dict) else {}


def _stress_rows(figures: dict[str, Any]) -> dict[str, Any]:
    levels = figures.get("levels")
    if not isinstance(levels, dict) or not levels:
        return {}
    rows: dict[str, Any] = {}
    for level, values in levels.items():
        slug = re.sub(r"[^a-z0-9]+", "_", str(level).lower()).strip("_")  # concurrency=4 -> concurrency_4
        for name, path in LEVEL_NUMBERS:
            value = _get(values, path) if isinstance(values, dict) else None
            if _number(value):
                rows[f"stress_{slug}_{name}"] = value
    rows["stress_levels"] = dg.MetadataValue.md(levels_table(levels))
    return rows


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _quality_rows(figures: dict[str, Any]) -> dict[str, Any]:
    """Both models' bits per byte on the same held-out text, side by side, and the baseline."""
    rows: dict[str, Any] = {}
    for side in ("candidate", "deployed", "unigram"):
        value = (figures.get(side) or {}).get("bits_per_byte") if isinstance(figures.get(side), dict) else None
        if _number(value):
            rows[f"bits_per_byte_{side}"] = value
    if _number(figures.get("worse_by")):
        rows["quality_worse_by"] = figures["worse_by"]
    if rows:
        table = ["| model | bundle | bits per byte |", "|---|---|---|"]
        for side in ("candidate", "deployed", "unigram"):
            entry = figures.get(side)
            if isinstance(entry, dict) and _number(entry.get("bits_per_byte")):
                bundle = entry.get("bundle_id") or ("token frequencies" if side == "unigram" else "")
                table.append(f"| {side} | {_cell(bundle)} | {entry['bits_per_byte']:.4f} |")
        rows["quality"] = dg.MetadataValue.md("\n".join(table))
    return rows


def _compare_rows(figures: dict[str, Any]) -> dict[str, Any]:
    """The served speed comparison: the ratio of median latencies and its interval."""
    decision = figures.get("decision")
    if not isinstance(decision, dict) or not _number(decision.get("ratio")):
        return {}
    rows: dict[str, Any] = {"latency_ratio_vs_deployed": decision["ratio"]}  # plottable across gate runs
    interval = decision.get("interval")
    if isinstance(interval, list) and len(interval) == 2 and all(_number(v) for v in interval):
        rows["latency_ratio_interval_low"], rows["latency_ratio_interval_high"] = interval
    if isinstance(decision.get("verdict"), str):
        rows["speed_verdict"] = dg.MetadataValue.text(decision["verdict"])
    return rows


def _drill_rows(figures: dict[str, Any]) -> dict[str, Any]:
    keys = ("time_to_rollback_seconds", "pickup_seconds")
    return {key: figures[key] for key in keys if isinstance(figures.get(key), int | float)}


# Step name -> the metadata rows of its own it gets (numbers the UI plots across runs). Every
# step's figures are in `figures` whatever is here; a step missing from a report, or a figure
# missing from a step, adds no row. The quality step and the served speed comparison add
# theirs here.
STEP_ROWS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "quality": _quality_rows,
    "compare": _compare_rows,
    "stress": _stress_rows,
    "drill": _drill_rows,
}


def one_line(text: str, limit: int = VERDICT_CHARS) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def refused_verdict(message: str) -> str:
    """GateFailed's message as a verdict: `refused at stress: concurrency=1.ttft_ms.p99 = …`."""
    return one_line(re.sub(r"^gate failed at ", "refused at ", message))


def inconclusive(report: dict[str, Any]) -> bool:
    """The gate decided nothing (a busy machine): no refusal. Reports written before the gate
    said so have no `outcome`: they are failed or passed."""
    return report.get("outcome") == "inconclusive"


def verdict(report: dict[str, Any]) -> str:
    """What the gate decided, in one line: promoted (to which sequence), refused (where, why), or
    nothing (inconclusive: GateInconclusive's message, `inconclusive: the machine was busy (…)…`)."""
    failure, event = report.get("failure"), report.get("event")
    if isinstance(failure, dict) and failure.get("message"):
        message = str(failure["message"])
        return one_line(message) if inconclusive(report) else refused_verdict(message)
    if report.get("passed") and isinstance(event, dict):
        was = event["from"] or "none"
        return one_line(f"promoted {report['bundle_id']} to production (sequence {event['sequence']}, was {was})")
    return "not decided: the gate did not finish"


def report_metadata(report: dict[str, Any]) -> dict[str, Any]:
    """What the UI shows of a gate report (passed or failed). The verdict, the bundle and the
    numbers of each step come first (the asset page lists metadata in order, and shows these
    without a click); the tables, the JSON and the report's path after them."""
    steps = report["steps"]
    step_rows: dict[str, Any] = {}
    for name, rows in STEP_ROWS.items():
        step_rows.update(rows(_step_figures(steps, name)))
    return {
        "verdict": verdict(report),
        "bundle_id": report["bundle_id"],
        **{key: value for key, value in step_rows.items() if _number(value)},
        "gate_steps": dg.MetadataValue.md(
            steps_table(steps, "inconclusive: see verdict") if inconclusive(report) else steps_table(steps)
        ),
        **{key: value for key, value in step_rows.items() if not _number(value)},
        "figures": dg.MetadataValue.json({step["name"]: step["figures"] for step in steps}),
        "gate_report": dg.MetadataValue.path(report["path"]),
        "production_before": (report.get("production_before") or {}).get("bundle_id") or "none",
    }


def promoted_metadata(report: dict[str, Any]) -> dict[str, Any]:
    """The materialization's metadata when the gate passed and promoted (`report["event"]`)."""
    event = report["event"]
    return {
        **report_metadata(report),
        "already_serving": False,
        "sequence": event["sequence"],
        "previous_bundle_id": event["from"] or "none",
        "history_event": dg.MetadataValue.json({k: v for k, v in event.items() if k != "figures"}),
    }


def inconclusive_end(
    context: dg.AssetExecutionContext, undecided: GateInconclusive, retries: int, wait_s: float
) -> dg.RetryRequested | dg.Failure:
    """How a run ends a gate a busy machine left undecided: never as a refusal. While retries are
    left, a step retry (the whole gate again, `wait_s` later: the load may have passed; the
    sensor's run key is the bundle id, so no later run would be requested for it); after the
    last, a failure whose description starts `inconclusive:`, with the report's metadata."""
    attempt = context.retry_number
    if attempt < retries:
        context.log.warning(
            f"{undecided}; production unchanged; the gate runs again in {wait_s:g} s (retry {attempt + 1} of "
            f"{retries}: gate.busy_retries)"
        )
        return dg.RetryRequested(max_retries=retries, seconds_to_wait=wait_s)
    metadata: dict[str, Any] = {
        "verdict": one_line(str(undecided)),
        "outcome": "inconclusive",
        "inconclusive_step": undecided.step,
        "broken_figure": undecided.figure,
        "reason": dg.MetadataValue.text(undecided.reason),
        "attempts": attempt + 1,
    }
    if undecided.report is not None:
        metadata.update(report_metadata(undecided.report.as_dict()))
    tried = f"after {attempt + 1} attempts" if attempt else "with no retry left (gate.busy_retries 0)"
    return dg.Failure(
        description=f"{undecided}; production unchanged, the bundle not refused; {tried}: re-execute this run or "
        "run `aieng deploy gate` when the machine is quieter",
        metadata=metadata,
        allow_retries=False,
    )


def withdrawn_failure(bundle_id: str, event: dict[str, Any]) -> dg.Failure:
    """The run's failure for a bundle a rollback withdrew: the refusal names the rollback."""
    return dg.Failure(
        description=f"{withdrawn_refusal(bundle_id, event, PRODUCTION)}; to gate it anyway, run with the tag "
        f"{ALLOW_WITHDRAWN_TAG}=true",
        metadata={
            "bundle_id": bundle_id,
            "withdrawn_by_sequence": event["sequence"],
            "time": event["time"],
            "reason": dg.MetadataValue.text(event["reason"] or "(none given)"),
            "actor": event["actor"],
        },
        allow_retries=False,
    )


@dg.asset(
    key=gate_core.KIND,
    deps=[serving_bundle],
    backfill_policy=single_run,
    code_version=gate_core.CODE_VERSION,
    group_name="deployment",
    kinds={"python"},
    description=(
        "The promotion gate on the current serving_bundle, then the switch: verify (integrity, goldens), quality "
        "(bits per byte of both sides' held-out text, candidate beside the deployed model: at most "
        "gate.max_quality_regression worse, and below the unigram baseline), warmup (cold vs warm first request, "
        "peak memory against weights x 1.3 + 2 GiB), compare (both bundles served in this run in fresh servers, the "
        "same requests in interleaved pairs; slower only when the interval of the median latency ratio lies above "
        "1 + gate.max_regression), stress test of a real "
        "`aieng serve` (closed loop at gate.concurrencies, Poisson at gate.poisson_rates; P99 TTFT and E2EL "
        "SLOs, goodput floor, no error), rollback drill on the drill pointer under traffic (goldens after every "
        "switch, time to rollback), then the atomic promote on production with every figure in its history "
        "line. A failed gate leaves production serving what it served. A stress SLO broken only while other "
        "processes took the CPU (gate.busy_cores_limit) is inconclusive, not a refusal: the gate runs again "
        "(gate.busy_retries), then the run fails as inconclusive. A bundle a rollback withdrew is "
        f"refused, naming the rollback, unless the run has the tag {ALLOW_WITHDRAWN_TAG}=true. A promote or "
        "rollback made with `aieng deploy` is recorded here too (a runless materialization: by the CLI when "
        "AIENG_DAGSTER_URL names the webserver, else by deployment_pointer_sensor), so the latest "
        "materialization names what production serves."
    ),
)
def production_deployment(context: dg.AssetExecutionContext, aieng: AiengResource) -> dg.MaterializeResult:
    from aieng_core.gate import GateFailed, run_gate

    store = aieng.store()
    bundle = store.require_current(asset_keys.SERVING_BUNDLE)
    production = Deployments(store.home, store=store)
    requested = context.run.tags.get(BUNDLE_ID_TAG)
    if requested is not None and requested != bundle.id:
        context.log.warning(
            f"this run was requested for serving_bundle {requested}; the current one is {bundle.id}, which is gated"
        )
    serving = gate_core.already_serving(production, bundle.id)
    if serving is not None:
        note = gate_core.not_gated_again(bundle.id, serving["sequence"])
        context.log.info(note)
        return dg.MaterializeResult(
            data_version=dg.DataVersion(f"{bundle.id}:{serving['sequence']}"),
            metadata={
                "verdict": one_line(
                    f"not gated again: production already serves {bundle.id} (sequence {serving['sequence']})"
                ),
                "bundle_id": bundle.id,
                "already_serving": True,
                "note": dg.MetadataValue.text(note),
                "sequence": serving["sequence"],
                "history_event": dg.MetadataValue.json(serving["event"] or {}),
            },
        )
    allow_withdrawn = context.run.tags.get(ALLOW_WITHDRAWN_TAG) == "true"
    withdrawal = production.withdrawal(bundle.id)
    if withdrawal is not None:
        if not allow_withdrawn:
            raise withdrawn_failure(bundle.id, withdrawal)
        context.log.warning(
            f"{withdrawn_refusal(bundle.id, withdrawal, PRODUCTION)}; gated anyway: this run has the tag "
            f"{ALLOW_WITHDRAWN_TAG}=true (a promote records allow_withdrawn in the history)"
        )
    try:
        report = run_gate(
            store.home,
            aieng.settings(),
            bundle.id,
            run_id=context.run.run_id,
            logger=context.log,
            allow_withdrawn=allow_withdrawn,
        )
    except BundleWithdrawn as refusal:  # withdrawn by a rollback made since the check above
        raise withdrawn_failure(refusal.bundle_id, refusal.event) from None
    except GateInconclusive as undecided:  # before GateFailed: it is one, but refuses nothing
        gate = aieng.settings().gate
        raise inconclusive_end(context, undecided, gate.busy_retries, gate.busy_retry_seconds) from None
    except GateFailed as failure:
        metadata: dict[str, Any] = {
            "verdict": refused_verdict(str(failure)),
            "outcome": "failed",
            "failed_step": failure.step,
            "failed_figure": failure.figure,
            "value": dg.MetadataValue.text(str(failure.value)),
            "limit": dg.MetadataValue.text(str(failure.limit)),
            "reason": dg.MetadataValue.text(failure.reason),
        }
        if failure.report is not None:
            metadata.update(report_metadata(failure.report.as_dict()))
        raise dg.Failure(description=str(failure), metadata=metadata) from None
    event = report.event
    assert event is not None
    return dg.MaterializeResult(
        data_version=dg.DataVersion(f"{bundle.id}:{event['sequence']}"),
        metadata=promoted_metadata(report.as_dict()),
    )


@dg.asset_check(
    asset=production_deployment,
    description=(
        "The rollback target is ready: what `aieng deploy rollback` would make current now (the top of "
        "production's stack, withdrawn bundles passed over) is re-hashed, loaded and its goldens replayed through "
        "the serving engine. Passes when it is ready or when there is nothing to roll back to; the result is "
        "written to deployments/production/rollback-check.json, which `aieng deploy status` and the server's "
        "aieng_rollback_target_ready gauge read."
    ),
)
def rollback_target_ready(aieng: AiengResource) -> dg.AssetCheckResult:
    from aieng_core.deploy.rollback_readiness import check_rollback_target
    from aieng_core.store.rollback_check import check_path

    home = aieng.store().home
    try:
        result = check_rollback_target(home, PRODUCTION)
    except DeploymentError as exc:  # production's own files are damaged (named): nothing could be checked
        return dg.AssetCheckResult(
            passed=False,
            severity=dg.AssetCheckSeverity.ERROR,
            description=str(exc),
            metadata={"problems": dg.MetadataValue.json([str(exc)])},
        )
    metadata: dict[str, Any] = {
        "bundle_id": result["bundle_id"] or "none",
        "problems": dg.MetadataValue.json(result["problems"]),
        "goldens_checked": result["goldens_checked"],
        "seconds": result["seconds"],
        "checked_at": result["checked_at"],
        "sequence": result["sequence"],
        "result_file": dg.MetadataValue.path(str(check_path(home, PRODUCTION))),
    }
    if result["ok"] is None:
        note = f"nothing to roll back to: production (sequence {result['sequence']}) has no earlier bundle left"
        metadata["note"] = dg.MetadataValue.text(note)
        return dg.AssetCheckResult(passed=True, description=note, metadata=metadata)
    if result["ok"]:
        description = (
            f"rollback target {result['bundle_id']} is ready: re-hashed, loaded, {result['goldens_checked']} "
            f"goldens replayed in {result['seconds']:.1f} s"
        )
        return dg.AssetCheckResult(passed=True, description=description, metadata=metadata)
    problems = result["problems"] or ["verification failed"]
    more = f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else ""
    return dg.AssetCheckResult(
        passed=False,
        severity=dg.AssetCheckSeverity.ERROR,
        description=f"rollback target {result['bundle_id']} is not ready: {problems[0]}{more}",
        metadata=metadata,
    )


CHECKS = [rollback_target_ready]
