"""`aieng bench [data|model|serving|prefix]`: the side-by-side benchmarks, as JSON."""

from __future__ import annotations

import argparse

from aieng_core.output import emit


def cmd_bench(args: argparse.Namespace) -> int:
    if args.suite == "serving":
        from aieng_core.bench.serving_bench import format_serving_results, run_serving_bench

        emit(
            run_serving_bench(
                out=args.out, config=args.config, quick=args.quick, rounds=args.rounds, workload=args.workload
            ),
            args.json,
            format_serving_results,
        )
        return 0
    if args.suite == "prefix":
        from aieng_core.bench.prefix_bench import format_prefix_results, run_prefix_bench

        emit(
            run_prefix_bench(out=args.out, config=args.config, quick=args.quick, rounds=args.rounds),
            args.json,
            format_prefix_results,
        )
        return 0
    if args.suite == "model":
        from aieng_core.bench.model_bench import format_model_results, run_model_bench

        emit(
            run_model_bench(steps=args.steps, rounds=args.rounds, out=args.out, config=args.config),
            args.json,
            format_model_results,
        )
        return 0
    if args.suite != "data":
        raise ValueError(
            f"benchmark suite {args.suite!r} is not available; choose 'data', 'model', 'serving' or 'prefix'"
        )
    from aieng_core.bench.data_bench import format_results, run_data_bench

    emit(
        run_data_bench(
            size_mb=args.size_mb, large_mb=args.large_mb, cli_mb=args.cli_mb, out=args.out, config=args.config
        ),
        args.json,
        format_results,
    )
    return 0


def add_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    bench = commands.add_parser("bench", help="side-by-side benchmarks against peers, as JSON")
    bench.add_argument("suite", nargs="?", default="data", choices=["data", "model", "serving", "prefix"])
    bench.add_argument("--size-mb", type=float, default=20.0, help="size of the synthetic partition (default 20)")
    bench.add_argument(
        "--large-mb", type=float, default=200.0, help="size of the large partition for the memory run (default 200)"
    )
    bench.add_argument(
        "--cli-mb", type=float, default=40.0, help="size of the partition run through the Dagster CLI (default 40)"
    )
    bench.add_argument(
        "--rounds", type=int, default=3, help="model, serving, prefix: rounds per side, order alternated (default 3)"
    )
    bench.add_argument("--steps", type=int, default=20, help="model: timed training steps per run (default 20)")
    bench.add_argument("--quick", action="store_true", help="serving, prefix: fewer rounds and requests (a smoke run)")
    bench.add_argument(
        "--workload",
        choices=["all", "contention"],
        default="all",
        help="serving: every workload (default), or only the contention workload (the server, its spin-waiting "
        "baseline and CTranslate2, alone and beside one busy process)",
    )
    bench.add_argument("--out", help="also write the JSON results to this file")
    bench.add_argument("--json", action="store_true")
    bench.set_defaults(handler=cmd_bench)
