"""docs/reference/metrics.md: every metric `aieng serve` exports, from its registry."""

from __future__ import annotations

import importlib
from typing import Any

from reference_pages.markdown import (
    METRICS_MODULE,
    banner,
    cell,
    code,
    module_file,
    page,
    table,
)


def _metric_objects(metrics: Any) -> list[Any]:
    from prometheus_client.metrics import MetricWrapperBase

    return [value for value in vars(metrics).values() if isinstance(value, MetricWrapperBase)]


def render_metrics() -> str:
    """docs/reference/metrics.md from METRIC_HELP and a constructed ServingMetrics' registry."""
    module = importlib.import_module(METRICS_MODULE)
    metric_help: dict[str, str] = module.METRIC_HELP
    metrics = module.ServingMetrics()
    labels: dict[str, set[str]] = {}
    buckets: dict[str, list[float]] = {}
    for metric in _metric_objects(metrics):
        labels.setdefault(metric._name, set()).update(metric._labelnames)
        if getattr(metric, "_upper_bounds", None):
            buckets[metric._name] = [bound for bound in metric._upper_bounds if bound != float("inf")]
    families: dict[str, dict[str, Any]] = {}
    process_families = []
    for family in metrics.registry.collect():
        name = family.name + "_total" if family.type == "counter" else family.name
        if name not in metric_help and name.startswith("process_"):
            process_families.append(name)  # prometheus_client's process collector: platform-dependent
            continue
        names = set(labels.get(family.name, set()))
        for sample in family.samples:
            names.update(key for key in sample.labels if key not in ("le", "quantile"))
        families[name] = {"type": family.type, "documentation": family.documentation, "labels": sorted(names)}
        if family.name in buckets:
            families[name]["buckets"] = buckets[family.name]
    order = [name for name in metric_help if name in families]
    order += sorted(name for name in families if name not in metric_help)
    rows = []
    for name in order:
        family = families[name]
        rows.append(
            [
                code(name),
                family["type"],
                ", ".join(code(label) for label in family["labels"]),
                cell(metric_help.get(name) or family["documentation"]),
            ]
        )
    missing = [name for name in metric_help if name not in families]
    out = [
        banner(module_file(METRICS_MODULE)),
        "",
        "# Metrics reference",
        "",
        "Every metric `GET /metrics` exposes (Prometheus text format), with its type, its labels and what it "
        "means. How to scrape it and the alert rules: [Metrics and alerts](../serving/metrics.md).",
        "",
    ]
    out += table(["metric", "type", "labels", "meaning"], rows) + [""]
    out += [
        "A histogram `x` is exposed as `x_bucket` (label `le`), `x_sum` and `x_count`; a counter `x_total` also "
        "as `x_created`. The server's registry also carries prometheus_client's process collector "
        "(`process_resident_memory_bytes`, `process_cpu_seconds_total`, `process_open_fds`, ... where the "
        "platform provides them).",
        "",
    ]
    if missing:
        out += ["Described but not registered: " + ", ".join(code(name) for name in missing) + ".", ""]
    if buckets:
        out += ["## Histogram buckets", "", "Upper bounds of each histogram's buckets (plus `+Inf`):", ""]
        bucket_rows = []
        for name in order:
            if "buckets" in families[name]:
                bounds = ", ".join(f"{bound:g}" for bound in families[name]["buckets"])
                bucket_rows.append([code(name), bounds])
        out += table(["metric", "bucket upper bounds"], bucket_rows) + [""]
    return page(out)
