"""The report's figures in two flat forms: the manifest metrics (the serving bundle carries
them) and a markdown table for the Dagster UI."""

from __future__ import annotations

from typing import Any

LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el")
PERCENTILES = ("p50", "p99")


def summary_metrics(report: dict[str, Any]) -> dict[str, Any]:
    """One flat mapping of the headline figures; a figure that was not measured is absent."""
    metrics: dict[str, Any] = {
        "model_checkpoint_id": report["model_checkpoint_id"],
        "parameters": report["parameters"],
        "threads": report["environment"]["threads"],
        "seconds": report["seconds"],
        "truncated": report["truncated"],
        "truncated_reason": report["truncated_reason"],
    }
    quality = report["quality"]
    if quality is not None:
        for name in (
            "validation_loss",
            "validation_perplexity",
            "unigram_baseline_loss",
            "unigram_baseline_perplexity",
            "perplexity_vs_unigram",
            "beats_unigram",
        ):
            metrics[name] = quality[name]
    for row in report["throughput"]:
        size = row["batch_size"]
        metrics[f"tokens_per_second_batch_{size}"] = row["ours"]["tokens_per_second"]
        if row["transformers"] is not None:
            metrics[f"transformers_tokens_per_second_batch_{size}"] = row["transformers"]["tokens_per_second"]
            metrics[f"ratio_vs_transformers_batch_{size}"] = row["ratio_vs_transformers"]
    int8 = report.get("int8")
    if int8 is not None:
        metrics["int8_validation_loss"] = int8["quality"]["validation_loss"]
        if int8["golden_agreement"] is not None:
            metrics["int8_golden_token_agreement"] = int8["golden_agreement"]["token_agreement"]
        for row in report["throughput"]:
            metrics[f"int8_tokens_per_second_batch_{row['batch_size']}"] = row["int8"]["tokens_per_second"]
    for level in report["latency"]:
        for name in LATENCY_METRICS:
            for percentile in PERCENTILES:
                metrics[f"{name}_{percentile}_ms_concurrency_{level['concurrency']}"] = level[f"{name}_ms"][percentile]
    memory = report["memory"]
    metrics["peak_rss_bytes"] = memory["peak_rss_bytes"]
    metrics["memory_budget_bytes"] = memory["budget_bytes"]
    metrics["within_memory_budget"] = memory["within_budget"]
    return metrics


def _number(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def figures_markdown(report: dict[str, Any]) -> str:
    """The figures as markdown: quality, throughput side by side, latency by concurrency, memory."""
    lines: list[str] = []
    if report["truncated"]:
        lines += [f"**truncated**: {report['truncated_reason']}", ""]
    quality = report["quality"]
    if quality is not None:
        lines += [
            "| validation loss | perplexity | unigram baseline loss | unigram perplexity | recorded at training |",
            "|---|---|---|---|---|",
            f"| {quality['validation_loss']:.4f} | {quality['validation_perplexity']:.2f} | "
            f"{quality['unigram_baseline_loss']:.4f} | {quality['unigram_baseline_perplexity']:.2f} | "
            f"{_number(quality['recorded_validation_loss'], 4)} |",
            "",
        ]
    if report["throughput"]:
        lines += ["| batch | ours tok/s | transformers tok/s | ours / transformers |", "|---|---|---|---|"]
        for row in report["throughput"]:
            theirs = row["transformers"]
            lines.append(
                f"| {row['batch_size']} | {_number(row['ours']['tokens_per_second'])} | "
                f"{_number(theirs['tokens_per_second']) if theirs else 'n/a'} | "
                f"{_number(row['ratio_vs_transformers'], 2)} |"
            )
        lines.append("")
    int8 = report.get("int8")
    if int8 is not None:
        lines += int8_markdown(report, int8)
    if report["latency"]:
        header = " | ".join(f"{name.upper()} {p.upper()}" for name in LATENCY_METRICS for p in PERCENTILES)
        lines += [f"| in flight | {header} | tok/s |", "|---" * (2 + len(LATENCY_METRICS) * len(PERCENTILES)) + "|"]
        for level in report["latency"]:
            cells = " | ".join(_number(level[f"{name}_ms"][p], 2) for name in LATENCY_METRICS for p in PERCENTILES)
            lines.append(f"| {level['concurrency']} | {cells} | {_number(level['output_throughput'])} |")
        lines += ["", "latency in ms, measured in process through the threaded engine loop", ""]
    memory = report["memory"]
    verdict = "within" if memory["within_budget"] else "**over**"
    lines.append(
        f"peak RSS {memory['peak_rss_bytes'] / 2**20:,.0f} MiB, {verdict} the budget of "
        f"{memory['budget_bytes'] / 2**30:.2f} GiB ({memory['rule']}); report measured in {report['seconds']:.1f} s"
    )
    return "\n".join(lines)


def int8_markdown(report: dict[str, Any], int8: dict[str, Any]) -> list[str]:
    """The int8 variant beside the float32 model: quality, greedy agreement, throughput."""
    quality, fp32 = int8["quality"], report["quality"]
    agreement = int8["golden_agreement"]
    lines = [
        f"int8 variant ({int8['method']}):",
        "",
        "| | float32 | int8 |",
        "|---|---|---|",
        f"| validation loss | {_number(fp32['validation_loss'] if fp32 else None, 4)} | "
        f"{quality['validation_loss']:.4f} |",
    ]
    for row in report["throughput"]:
        lines.append(
            f"| tok/s at batch {row['batch_size']} | {_number(row['ours']['tokens_per_second'])} | "
            f"{_number(row['int8']['tokens_per_second'])} ({row['ratio_int8_vs_ours']:.2f}x) |"
        )
    if agreement is not None:
        lines.append(
            f"| greedy goldens identical to float32 | | {agreement['identical']}/{agreement['prompts']} "
            f"({agreement['token_agreement']:.0%} of tokens before the first divergence) |"
        )
    return [*lines, ""]
