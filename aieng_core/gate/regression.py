"""The candidate's stress figures against those of the bundle production serves now.

The baseline is read from the production history event that promoted the deployed bundle
(its `figures`, written by the gate that let it in). At each load level both gates measured,
the candidate may be at most `max_regression` worse: output tokens/s lower, or P99 TTFT or
P99 E2EL higher, by more than that fraction. On a first deployment, or when the deployed
bundle was promoted without gate figures (by hand), nothing is compared, and the figures say
why.
"""

from __future__ import annotations

from typing import Any

from aieng_core.hashing import sha256_json

# The settings that shape the load and the server under it; SLOs and thresholds are not among
# them (a gate may be stricter or looser and still measure the same thing).
LOAD_KEYS = ("concurrencies", "poisson_rates", "requests_per_level", "max_new_tokens", "max_seconds_per_level")


def load_sha256(config: Any) -> str:
    """Hash of what decides the stress figures: the server's settings (serving:), the engine
    limits bundles are built with (bundle:'s max_batch, max_context, max_prefill_tokens) and
    the gate's load keys. (Before the bundle: section split from serving:, the engine limits
    were in the serving: hash: figures recorded then are "not comparable", never misread.)"""
    from aieng_core.bundle.serving_bundle import ENGINE_LIMIT_FIELDS

    gate, recipe = config.gate.model_dump(mode="json"), config.bundle.model_dump(mode="json")
    return sha256_json(
        {
            "serving": config.serving.model_dump(mode="json"),
            "bundle": {k: recipe[k] for k in ENGINE_LIMIT_FIELDS},
            "gate": {k: gate[k] for k in LOAD_KEYS},
        }
    )


# (figure, path inside a level's figures, whether higher is better)
COMPARED = (
    ("output_throughput", ("output_throughput",), True),
    ("ttft_ms.p99", ("ttft_ms", "p99"), False),
    ("e2el_ms.p99", ("e2el_ms", "p99"), False),
)


def baseline_event(production: Any) -> dict[str, Any] | None:
    """The history event that promoted what `production` (a Deployments) serves now, or None
    when nothing is deployed."""
    bundle_id = production.current()["bundle_id"]
    if bundle_id is None:
        return None
    for event in reversed(production.history()):
        if event["action"] == "promote" and event["to"] == bundle_id:
            return event
    return None


def _figure(level: dict[str, Any], path: tuple[str, ...]) -> float | None:
    value: Any = level
    for key in path:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def compare(
    levels: dict[str, dict[str, Any]],
    deployed_bundle_id: str | None,
    event: dict[str, Any] | None,
    max_regression: float,
    settings_sha256: str | None = None,
) -> dict[str, Any]:
    """`{baseline_bundle_id, baseline_sequence, compared, note, max_regression, checks, regressions}`;
    each check is `{level, figure, candidate, baseline, worse_by, passed}` (worse_by: the
    fraction by which the candidate is worse, negative when it is better)."""
    result: dict[str, Any] = {
        "baseline_bundle_id": deployed_bundle_id,
        "baseline_sequence": None if event is None else event["sequence"],
        "max_regression": max_regression,
        "compared": False,
        "checks": [],
        "regressions": [],
    }
    if deployed_bundle_id is None:
        result["note"] = "first deployment: nothing is deployed, so there is nothing to compare with"
        return result
    baseline = (((event or {}).get("figures") or {}).get("stress") or {}).get("levels")
    if not isinstance(baseline, dict) or not baseline:
        how = "no promote event" if event is None else f"event {event['sequence']} by {event['actor']!r}"
        result["note"] = (
            f"no comparison: the deployed bundle {deployed_bundle_id} has no gate stress figures ({how}; "
            "promoted without the gate)"
        )
        return result
    recorded = (((event or {}).get("figures") or {}).get("gate") or {}).get("load_sha256")
    if settings_sha256 is not None and recorded is not None and recorded != settings_sha256:
        # Other load (requests, token counts) or server settings give other figures: comparing
        # them would fail or pass candidates for the settings' sake, not the bundle's.
        result["note"] = (
            f"not comparable: the gate of {deployed_bundle_id} ran another load (serving: or gate: load settings) "
            f"(config {recorded[:12]}, this gate {settings_sha256[:12]})"
        )
        return result
    shared = [name for name in levels if name in baseline]
    if not shared:
        result["note"] = (
            f"no comparison: no load level in common with the gate of {deployed_bundle_id} "
            f"(it measured {sorted(baseline)}, this gate {sorted(levels)})"
        )
        return result
    for name in shared:
        for figure, path, higher_is_better in COMPARED:
            candidate, base = _figure(levels[name], path), _figure(baseline[name], path)
            if candidate is None or base is None or base <= 0:
                continue
            worse_by = (base - candidate) / base if higher_is_better else (candidate - base) / base
            check = {
                "level": name,
                "figure": figure,
                "candidate": candidate,
                "baseline": base,
                "worse_by": worse_by,
                "passed": worse_by <= max_regression,
            }
            result["checks"].append(check)
            if not check["passed"]:
                result["regressions"].append(check)
    result["compared"] = bool(result["checks"])
    skipped = sorted(set(levels) - set(shared))
    result["note"] = (
        f"compared with the gate figures of {deployed_bundle_id} (history event {result['baseline_sequence']}) "
        f"at {len(shared)} load levels" + (f"; not measured there: {skipped}" if skipped else "")
    )
    return result
