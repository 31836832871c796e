"""The serving benchmark's results as text: `aieng bench serving` without --json."""

from __future__ import annotations

from typing import Any


def _fig(figure: dict[str, Any], unit: str = "tok/s") -> str:
    return f"{figure['median']:,.0f} {unit} ({figure['min']:,.0f}-{figure['max']:,.0f})"


def _contention_lines(contention: dict[str, Any]) -> list[str]:
    """Each peer alone and beside one busy process: tok/s alone / busy (busy over alone)."""
    lines = []
    for label, workload, ct2_workload in (
        ("16 clients", "mixed_16_clients", "mixed_batch_16"),
        ("single stream", "single_stream", "single_stream"),
    ):
        peers = [
            (
                name,
                contention[peer]["alone"][key],
                contention[peer]["busy"][key],
                contention[peer]["busy_over_alone"][key],
            )
            for name, peer, key in (
                ("ours", "ours", workload),
                ("spin-waiting baseline", "baseline", workload),
                ("CTranslate2", "ctranslate2", ct2_workload),
            )
        ]
        lines.append(
            f"contention {label:<14}alone / beside a busy process: "
            + " | ".join(f"{name} {_fig(alone)} / {_fig(busy)} ({ratio:.2f})" for name, alone, busy, ratio in peers)
        )
    rounds = " | ".join(
        f"{peer} {condition} {contention[peer][condition]['first_over_third']:.2f} "
        f"(engine threads at end {contention[peer][condition]['engine_threads_at_end']['median']:.0f})"
        for peer in ("ours", "baseline")
        for condition in ("alone", "busy")
    )
    lines.append(f"contention first round after ready / third: {rounds}")
    return lines


def _goal_lines(results: dict[str, Any]) -> list[str]:
    lines = ["goals:"]
    for name, goal in results["goals"].items():
        lines.append(
            f"  {name:<52} {goal['ratio']:>7.2f} (target {goal['comparison']} {goal['target']}) "
            f"{'met' if goal['met'] else 'MISSED'}"
        )
    if results["bounds"]:
        lines.append("bounds:")
        lines.extend(f"  - {note}" for note in results["bounds"])
    return lines


def format_serving_results(results: dict[str, Any]) -> str:
    figures = results["figures"]
    if results.get("workload") == "contention":
        return "\n".join([*_contention_lines(figures["contention"]), *_goal_lines(results)])
    rounds = results["method"]["rounds"]
    load = results["machine"]["load_average_at_start"]
    single = figures["single_stream"]
    lines = [
        f"model            {results['model']['parameters']:,} parameters, {results['machine']['threads']} threads, "
        f"medians of {rounds} round(s) (min-max); 1-min load average at start {load[0]:.2f}",
        f"single stream    ours {_fig(single['ours'])} | transformers {_fig(single['transformers'])} | "
        f"CTranslate2 {_fig(single['ctranslate2'])}",
    ]
    for size, figure in figures["batch_vs_ctranslate2"].items():
        if isinstance(figure, dict) and "ours" in figure and size != "1":
            lines.append(
                f"batch {size:<10} ours {_fig(figure['ours'])} | CTranslate2 {_fig(figure['ctranslate2'])} | "
                f"transformers {_fig(figure['transformers'])}"
            )
    http = figures["http_16_clients_mixed"]
    lines.append(
        f"16 HTTP clients  ours {_fig(http['ours_http'])} (in-process {_fig(http['ours_in_process'])}) | "
        f"transformers one at a time {_fig(http['transformers_sequential'])}, static batch "
        f"{_fig(http['transformers_static_batch'])} | CTranslate2 batch {_fig(http['ctranslate2_batch'])}"
    )
    metrics = figures["serving_metrics"]
    for kind, label in (("concurrency", "concurrency"), ("poisson_rate", "rate")):
        for key, m in metrics[kind].items():
            ttft = m["ttft_ms"]
            lines.append(
                f"{label} {key:<9}   TTFT p50/p99 {ttft['p50']['median']:.0f}/{ttft['p99']['median']:.0f} ms, "
                f"TPOT p50 {m['tpot_ms']['p50']['median']:.1f} ms, ITL p99 {m['itl_ms']['p99']['median']:.1f} ms, "
                f"E2EL p50 {m['e2el_ms']['p50']['median']:.0f} ms, {m['output_throughput']['median']:,.0f} tok/s, "
                f"{m['request_throughput']['median']:.1f} req/s, goodput {m['goodput']['median']:.1f} req/s"
            )
    flops = figures["flops_at_batch_64"]
    lines.append(
        f"FLOP/s batch 64  {flops['achieved_gflops']['median']:.1f} GFLOP/s of a "
        f"{flops['matmul_peak_gflops']['median']:.0f} GFLOP/s matmul peak ({flops['fraction_of_peak']['median']:.0%})"
    )
    lines.extend(_contention_lines(figures["contention"]))
    return "\n".join([*lines, *_goal_lines(results)])
