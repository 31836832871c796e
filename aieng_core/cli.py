"""The `aieng` command line. Every `--json` output is one JSON document on stdout."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import shlex
import sys
from pathlib import Path
from typing import Any

from aieng_core.config import ConfigError, load_config
from aieng_core.deploy.cli import add_deploy_parser
from aieng_core.deploy.deployments import DEFAULT_POINTER
from aieng_core.home import raw_partition_dir, resolve_home
from aieng_core.output import emit
from aieng_core.store import ArtifactIntegrityError, ArtifactNotFound, ArtifactStore
from aieng_core.store.artifacts import validate_name
from aieng_core.store.lineage_cli import add_lineage_parser
from aieng_core.store.store_cli import add_store_parser

# Errors a user can act on: printed as one line, never as a traceback.
USER_ERRORS = (ConfigError, ArtifactNotFound, ArtifactIntegrityError, FileNotFoundError, FileExistsError, ValueError)


def cmd_demo_data(args: argparse.Namespace) -> int:
    from aieng_core.data.demo_data import land_demo_data

    home = resolve_home(args.home)
    start = args.start or load_config(args.config).data.start_date
    folders = [raw_partition_dir(home, (start + dt.timedelta(days=n)).isoformat()) for n in range(args.days)]
    if args.if_missing and all(folder.is_dir() and any(folder.iterdir()) for folder in folders):
        print(f"demo data already landed under {home / 'raw'}; leaving it as it is", file=sys.stderr)
        return 0
    written = land_demo_data(home, start_date=start, days=args.days, overwrite=args.overwrite)
    days = sorted({path.parent.name for path in written})
    result = {"home": str(home), "partitions": days, "files": [str(path) for path in written]}
    emit(
        result,
        args.json,
        lambda r: "\n".join(
            [f"landed {len(r['files'])} files for {len(r['partitions'])} days under {home / 'raw'}:"]
            + [f"  {path}" for path in r["files"]]
            + [f"partitions: {r['partitions'][0]}...{r['partitions'][-1]}"]
        ),
    )
    return 0


def cmd_data_report(args: argparse.Namespace) -> int:
    from aieng_core.data.report import format_report, partition_report

    report = partition_report(ArtifactStore(resolve_home(args.home)), args.partition)
    emit(report, args.json, format_report)
    return 0


def cmd_data_status(args: argparse.Namespace) -> int:
    from aieng_core.status import format_status, pipeline_status

    emit(pipeline_status(ArtifactStore(resolve_home(args.home))), args.json, format_status)
    return 0


def cmd_model_train(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from aieng_core.training.model_checkpoint import build_model_checkpoint

    config = load_config(args.config)
    with tqdm(
        total=config.training.max_steps, desc="training", unit="step", file=sys.stderr, disable=args.no_progress
    ) as bar:

        def on_step(step: int, record: dict[str, Any]) -> None:
            bar.update(step - bar.n)
            if "train_loss" in record:
                bar.set_postfix(loss=f"{record['train_loss']:.3f}", refresh=False)

        artifact = build_model_checkpoint(ArtifactStore(resolve_home(args.home)), config, on_step=on_step)
    result = {"id": artifact.id, "reused": artifact.reused, "path": str(artifact.path), "metrics": artifact.metrics}
    emit(
        result,
        args.json,
        lambda r: (
            f"model_checkpoint {r['id']} ({'reused' if r['reused'] else 'trained'})\n"
            f"  validation loss {r['metrics']['validation_loss']:.4f} vs unigram baseline "
            f"{r['metrics']['unigram_baseline_loss']:.4f} nats/token\n"
            f"  {r['metrics']['parameters']:,} parameters, {r['metrics']['steps']} steps "
            f"({r['metrics']['stopped_by']}), "
            f"{r['metrics']['tokens_per_second']:,.0f} tokens/s\n  {r['path']}"
        ),
    )
    return 0


def cmd_bundle_build(args: argparse.Namespace) -> int:
    from aieng_core.bundle.serving_bundle import build_report_and_bundle

    report, artifact = build_report_and_bundle(ArtifactStore(resolve_home(args.home)), load_config(args.config))
    result = {
        "id": artifact.id,
        "reused": artifact.reused,
        "path": str(artifact.path),
        "metrics": artifact.metrics,
        "benchmark_report": {"id": report.id, "reused": report.reused, "path": str(report.path)},
    }
    emit(
        result,
        args.json,
        lambda r: (
            f"serving_bundle {r['id']} ({'reused' if r['reused'] else 'built'}) of model_checkpoint "
            f"{r['metrics']['model_checkpoint_id']}, benchmark_report {r['benchmark_report']['id']}\n"
            f"  {r['metrics']['golden_prompts']} golden prompts, {r['metrics']['files']} files, "
            f"{r['metrics']['bytes']:,} bytes\n  {r['path']}"
        ),
    )
    return 0


def _format_verify(report: dict[str, Any]) -> str:
    lines = [f"serving bundle {report['bundle_id']} at {report['path']}: {'OK' if report['ok'] else 'FAILED'}"]
    lines.append(f"  {report['files_checked']} files checked against the manifest")
    for golden in report["goldens"]:
        lines.append(f"  {'ok  ' if golden['ok'] else 'DIFF'} {golden['prompt']!r} -> {golden['got_text']!r}")
    lines += [f"  problem: {problem}" for problem in report["problems"]]
    return "\n".join(lines)


def cmd_bundle_verify(args: argparse.Namespace) -> int:
    from aieng_core.bundle.verify import verify_bundle

    report = verify_bundle(Path(args.path))
    emit(report, args.json, _format_verify)
    if not report["ok"]:
        # One line naming the first file or prompt that differs; --json has them all.
        print(f"aieng: error: {report['problems'][0]}", file=sys.stderr)
        return 1
    return 0


def _aieng_executable() -> str:
    """The `aieng` beside this Python (a venv's bin/), else `aieng` on PATH."""
    beside = Path(sys.executable).parent / "aieng"
    return str(beside) if beside.is_file() else "aieng"


def cmd_bundle_current(args: argparse.Namespace) -> int:
    from aieng_core.bundle.serving_bundle import KIND
    from aieng_core.deploy.deployments import Deployments

    home = resolve_home(args.home)
    artifact = ArtifactStore(home).require_current(KIND)
    if args.path:
        print(artifact.path)
        return 0
    config = load_config(args.config)
    prompt = config.serving.golden_prompts[0]
    body = json.dumps({"prompt": prompt, "max_new_tokens": 32, "temperature": 0}, ensure_ascii=False)
    aieng = shlex.quote(_aieng_executable())
    production = Deployments(home).current()["bundle_id"]
    in_production = production == artifact.id
    result = {
        "id": artifact.id,
        "path": str(artifact.path),
        "model_checkpoint_id": artifact.metrics.get("model_checkpoint_id"),
        "lineage": artifact.manifest.get("lineage", {}),
        "production_bundle_id": production,
        # The production bundle is served by following the pointer, so a promote or rollback reaches it.
        "serve_command": (
            f"{aieng} serve --deployment current"
            if in_production
            else f"{aieng} serve --bundle {shlex.quote(str(artifact.path))}"
        ),
        "curl_command": (
            f"curl -s http://127.0.0.1:8000/generate -H 'Content-Type: application/json' -d {shlex.quote(body)}"
        ),
        "lineage_command": f"{aieng} lineage {'current' if in_production else artifact.id}",
    }

    def human(r: dict[str, Any]) -> str:
        if r["production_bundle_id"] is None:
            deployed = "production serves nothing yet (`aieng deploy promote ID`, or materialize production_deployment)"
        elif r["production_bundle_id"] == r["id"]:
            deployed = "production serves this bundle"
        else:
            deployed = f"production serves another bundle: {r['production_bundle_id']}"
        return (
            f"serving_bundle {r['id']} (model_checkpoint {r['model_checkpoint_id']})\n  {r['path']}\n"
            f"{deployed}\nserve it:\n  {r['serve_command']}\nthen query it:\n  {r['curl_command']}\n"
            f"what it was made from:\n  {r['lineage_command']}"
        )

    emit(result, args.json, human)
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from aieng_core.serving.server import run_server

    if args.pointer is not None and not args.deployment:
        raise ValueError("--pointer names the deployment pointer to follow: use it with --deployment current")
    pointer = validate_name(args.pointer or DEFAULT_POINTER, "deployment pointer")
    return run_server(
        bundle_path=Path(args.bundle) if args.bundle else None,
        host=args.host,
        port=args.port,
        config=load_config(args.config),
        log_level=args.log_level,
        follow_home=resolve_home(args.home) if args.deployment else None,
        pointer=pointer,
    )


def cmd_bench(args: argparse.Namespace) -> int:
    if args.suite == "serving":
        from aieng_core.bench.serving_bench import format_serving_results, run_serving_bench

        emit(
            run_serving_bench(out=args.out, config=args.config, quick=args.quick, rounds=args.rounds),
            args.json,
            format_serving_results,
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
        raise ValueError(f"benchmark suite {args.suite!r} is not available; choose 'data', 'model' or 'serving'")
    from aieng_core.bench.data_bench import format_results, run_data_bench

    emit(
        run_data_bench(
            size_mb=args.size_mb, large_mb=args.large_mb, cli_mb=args.cli_mb, out=args.out, config=args.config
        ),
        args.json,
        format_results,
    )
    return 0


def _date(value: str) -> dt.date:
    try:
        return dt.date.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a date in YYYY-MM-DD form") from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="aieng", description="aieng: raw text to a deployed LLM, with lineage.")
    parser.add_argument("--home", help="state directory (default: $AIENG_HOME or ./.aieng)")
    parser.add_argument("--config", help="YAML config (default: $AIENG_CONFIG or configs/pipeline.yaml)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = commands.add_parser("demo-data", help="land a few days of sample raw data (real text, a few dirty rows)")
    demo.add_argument("--start", type=_date, help="first day (default: data.start_date of the config)")
    demo.add_argument("--days", type=int, default=3, help="number of days to land (default 3)")
    demo.add_argument("--overwrite", action="store_true", help="replace demo files already landed")
    demo.add_argument("--if-missing", action="store_true", help="do nothing if every day already has landed files")
    demo.add_argument("--json", action="store_true")
    demo.set_defaults(handler=cmd_demo_data)

    data = commands.add_parser("data", help="data quality")
    data_commands = data.add_subparsers(dest="data_command", required=True, metavar="SUBCOMMAND")
    report = data_commands.add_parser("report", help="rows in, clean and quarantined (by reason) for one partition")
    report.add_argument("--partition", required=True, help="daily partition, YYYY-MM-DD")
    report.add_argument("--json", action="store_true")
    report.set_defaults(handler=cmd_data_report)

    status = data_commands.add_parser("status", help="the current artifact of every data asset and partition")
    status.add_argument("--json", action="store_true")
    status.set_defaults(handler=cmd_data_status)

    model = commands.add_parser("model", help="the language model")
    model_commands = model.add_subparsers(dest="model_command", required=True, metavar="SUBCOMMAND")
    train = model_commands.add_parser(
        "train", help="train model_checkpoint on the current dataset_manifest (or reuse it)"
    )
    train.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    train.add_argument("--json", action="store_true")
    train.set_defaults(handler=cmd_model_train)

    bundle = commands.add_parser("bundle", help="the serving bundle: build, verify, show the current one")
    bundle_commands = bundle.add_subparsers(dest="bundle_command", required=True, metavar="SUBCOMMAND")
    bundle_build = bundle_commands.add_parser(
        "build", help="bundle the current model_checkpoint for serving (or reuse the bundle)"
    )
    bundle_build.add_argument("--json", action="store_true")
    bundle_build.set_defaults(handler=cmd_bundle_build)
    verify = bundle_commands.add_parser(
        "verify", help="re-hash every file, load the model, replay the golden prompts; non-zero on any difference"
    )
    verify.add_argument("path", help="the bundle directory")
    verify.add_argument("--json", action="store_true")
    verify.set_defaults(handler=cmd_bundle_verify)
    current = bundle_commands.add_parser("current", help="the current bundle, and the commands that serve and query it")
    current_output = current.add_mutually_exclusive_group()
    current_output.add_argument("--json", action="store_true")
    current_output.add_argument("--path", action="store_true", help="print only the bundle's path")
    current.set_defaults(handler=cmd_bundle_current)

    serve = commands.add_parser("serve", help="serve a bundle over HTTP (OpenAI-compatible completions)")
    serving_what = serve.add_mutually_exclusive_group(required=True)
    serving_what.add_argument("--bundle", help="the serving bundle directory (`aieng bundle current --path`)")
    serving_what.add_argument(
        "--deployment",
        choices=["current"],
        help="follow a deployment pointer (--pointer; production by default): a promote or rollback swaps the bundle",
    )
    serve.add_argument(
        "--pointer",
        metavar="NAME",
        help=f"with --deployment current: the pointer to follow (default {DEFAULT_POINTER})",
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    serve.add_argument("--port", type=int, default=8000, help="port to bind (default 8000)")
    serve.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"], help="log level (default info)"
    )
    serve.set_defaults(handler=cmd_serve)

    add_deploy_parser(commands)
    add_lineage_parser(commands)
    add_store_parser(commands)

    bench = commands.add_parser("bench", help="side-by-side benchmarks against peers, as JSON")
    bench.add_argument("suite", nargs="?", default="data", choices=["data", "model", "serving"])
    bench.add_argument("--size-mb", type=float, default=20.0, help="size of the synthetic partition (default 20)")
    bench.add_argument(
        "--large-mb", type=float, default=200.0, help="size of the large partition for the memory run (default 200)"
    )
    bench.add_argument(
        "--cli-mb", type=float, default=40.0, help="size of the partition run through the Dagster CLI (default 40)"
    )
    bench.add_argument(
        "--rounds", type=int, default=3, help="model, serving: rounds per side, order alternated (default 3)"
    )
    bench.add_argument("--steps", type=int, default=20, help="model: timed training steps per run (default 20)")
    bench.add_argument("--quick", action="store_true", help="serving: fewer rounds and requests (a smoke run)")
    bench.add_argument("--out", help="also write the JSON results to this file")
    bench.add_argument("--json", action="store_true")
    bench.set_defaults(handler=cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s", stream=sys.stderr
    )
    if getattr(args, "days", 1) is not None and getattr(args, "days", 1) < 1:
        parser.error("--days must be at least 1")
    try:
        return args.handler(args)
    except USER_ERRORS as exc:
        print(f"aieng: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("aieng: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
