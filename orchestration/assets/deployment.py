"""production_deployment: the promotion gate on the current serving bundle, and the switch.

The asset calls aieng_core.gate.run_gate on the current serving_bundle (verify, warmup,
compare, stress test, rollback drill on the drill pointer, promote) and turns the gate report into
metadata. A failed gate raises dg.Failure naming the step and the figure, with production
left serving what it served. A bundle production already serves is not gated again.
"""

from typing import Any

import dagster as dg

from aieng_core import asset_keys
from aieng_core.deploy.deployments import Deployments
from aieng_core.gate import production_deployment as gate_core
from aieng_core.gate.report import step_headline
from orchestration.assets.serving import serving_bundle
from orchestration.partitions import single_run
from orchestration.resources import AiengResource

# The bundle a run was requested for (orchestration/sensors.py); the gate gates the current one.
BUNDLE_ID_TAG = "aieng/serving_bundle_id"

LEVEL_COLUMNS = (
    ("requests", "planned"),
    ("errors", "errors"),
    ("429", "rejected_429"),
    ("P50 TTFT ms", ("ttft_ms", "p50")),
    ("P99 TTFT ms", ("ttft_ms", "p99")),
    ("P99 TPOT ms", ("tpot_ms", "p99")),
    ("P99 ITL ms", ("itl_ms", "p99")),
    ("P99 E2EL ms", ("e2el_ms", "p99")),
    ("output tok/s", "output_throughput"),
    ("good fraction", "good_fraction"),
)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def _get(figures: dict[str, Any], path: str | tuple[str, ...]) -> Any:
    value: Any = figures
    for key in (path,) if isinstance(path, str) else path:
        value = value.get(key) if isinstance(value, dict) else None
    return value


def steps_table(steps: list[dict[str, Any]]) -> str:
    """One row per step run: passed, seconds, what it found (the gate's own headline)."""
    rows = ["| step | passed | seconds | found |", "|---|---|---|---|"]
    for step in steps:
        found = step_headline(step["name"], step["figures"]) if step["passed"] else "failed: see failed_figure"
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


def report_metadata(report: dict[str, Any]) -> dict[str, Any]:
    """What the UI shows of a gate report (passed or failed)."""
    steps = report["steps"]
    metadata: dict[str, Any] = {
        "bundle_id": report["bundle_id"],
        "gate_steps": dg.MetadataValue.md(steps_table(steps)),
        "figures": dg.MetadataValue.json({step["name"]: step["figures"] for step in steps}),
        "gate_report": dg.MetadataValue.path(report["path"]),
        "production_before": report["production_before"]["bundle_id"] or "none",
    }
    stress = next((step["figures"] for step in steps if step["name"] == "stress"), None)
    if stress and stress.get("levels"):
        metadata["stress_levels"] = dg.MetadataValue.md(levels_table(stress["levels"]))
    compare = next((step["figures"] for step in steps if step["name"] == "compare"), None)
    for row in (compare or {}).get("throughput", []):  # plottable across gate runs
        metadata[f"ratio_vs_deployed_batch_{row['batch_size']}"] = row["ratio_vs_deployed"]
    drill = next((step["figures"] for step in steps if step["name"] == "drill"), None)
    if drill and "time_to_rollback_seconds" in drill:
        metadata["time_to_rollback_seconds"] = drill["time_to_rollback_seconds"]
        metadata["pickup_seconds"] = drill["pickup_seconds"]
    return metadata


@dg.asset(
    key=gate_core.KIND,
    deps=[serving_bundle],
    backfill_policy=single_run,
    code_version=gate_core.CODE_VERSION,
    group_name="deployment",
    kinds={"python"},
    description=(
        "The promotion gate on the current serving_bundle, then the switch: verify (integrity, goldens), warmup "
        "(cold vs warm first request, peak memory against weights x 1.3 + 2 GiB), compare (the candidate's and the "
        "deployed bundle's tokens/s, measured side by side now), stress test of a real "
        "`aieng serve` (closed loop at gate.concurrencies, Poisson at gate.poisson_rates; P99 TTFT and E2EL "
        "SLOs, goodput floor, no error, no regression beyond gate.max_regression against the deployed bundle's "
        "gate figures), rollback drill on the drill pointer under traffic (goldens after every switch, time "
        "to rollback), then the atomic promote on production with every figure in its history line. A failed "
        "gate leaves production serving what it served."
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
                "bundle_id": bundle.id,
                "already_serving": True,
                "note": dg.MetadataValue.text(note),
                "sequence": serving["sequence"],
                "history_event": dg.MetadataValue.json(serving["event"] or {}),
            },
        )
    try:
        report = run_gate(store.home, aieng.settings(), bundle.id, run_id=context.run.run_id, logger=context.log)
    except GateFailed as failure:
        metadata: dict[str, Any] = {
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
        metadata={
            **report_metadata(report.as_dict()),
            "already_serving": False,
            "sequence": event["sequence"],
            "previous_bundle_id": event["from"] or "none",
            "history_event": dg.MetadataValue.json({k: v for k, v in event.items() if k != "figures"}),
        },
    )
