"""`aieng bundle build|verify|current`: the serving bundle."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

from aieng_core.asset_keys import MODEL_CHECKPOINT, SERVING_BUNDLE
from aieng_core.home import resolve_home
from aieng_core.output import emit
from aieng_core.store import ArtifactStore


def cmd_bundle_build(args: argparse.Namespace) -> int:
    from aieng_core.benchmark.benchmark_report import build_benchmark_report
    from aieng_core.bundle.serving_bundle import build_serving_bundle, refuse_partial

    # What the asset graph does in two steps: the current model's report (reused when its recipe
    # is unchanged, else measured), then the bundle carrying it. A partial model is refused first,
    # before anything is measured.
    from aieng_core.config import load_config  # pydantic: only for commands that read the config

    store, config = ArtifactStore(resolve_home(args.home)), load_config(args.config)
    refuse_partial(store.require_current(MODEL_CHECKPOINT), config.bundle)
    report = build_benchmark_report(store, config)
    artifact = build_serving_bundle(store, config)
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
            f"  {r['metrics']['golden_prompts']} golden prompts, {r['metrics'].get('golden_conversations', 0)} golden "
            f"conversations, {r['metrics']['files']} files, "
            f"{r['metrics']['bytes']:,} bytes\n{int8_lines(r['metrics'])}  {r['path']}"
        ),
    )
    return 0


def int8_lines(metrics: dict[str, Any]) -> str:
    """An int8 variant's source and figures, one line each; nothing for a float32 bundle."""
    if metrics.get("weights") != "int8":
        return ""
    agreement, quality = metrics["golden_agreement"], metrics["int8_quality"]
    return (
        f"  int8 variant of serving_bundle {metrics['source_bundle_id']} ({metrics['weights_method']})\n"
        f"  bits per byte on the held-out text: {quality['int8_bits_per_byte']:.4f} int8 vs "
        f"{quality['fp32_bits_per_byte']:.4f} float32 ({quality['worse_by']:+.2%})\n"
        f"  greedy goldens identical to float32: {agreement['identical']}/{agreement['prompts']} "
        f"({agreement['token_agreement']:.0%} of tokens before the first divergence)\n"
    )


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
    from aieng_core.deploy.deployments import Deployments

    home = resolve_home(args.home)
    artifact = ArtifactStore(home).require_current(SERVING_BUNDLE)
    if args.path:
        print(artifact.path)
        return 0
    from aieng_core.config import load_config  # pydantic: only for commands that read the config

    config = load_config(args.config)
    prompt = config.bundle.golden_prompts[0]
    body = json.dumps({"prompt": prompt, "max_new_tokens": 32, "temperature": 0}, ensure_ascii=False)
    aieng = shlex.quote(_aieng_executable())
    production = Deployments(home).current()["bundle_id"]
    in_production = production == artifact.id
    result = {
        "id": artifact.id,
        "path": str(artifact.path),
        "model_checkpoint_id": artifact.metrics.get("model_checkpoint_id"),
        "weights": artifact.metrics.get("weights", "fp32"),
        "source_bundle_id": artifact.metrics.get("source_bundle_id"),
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
            f"serving_bundle {r['id']} (model_checkpoint {r['model_checkpoint_id']}"
            + (f"; int8 variant of {r['source_bundle_id']}" if r["weights"] == "int8" else "")
            + f")\n  {r['path']}\n"
            f"{deployed}\nserve it:\n  {r['serve_command']}\nthen query it:\n  {r['curl_command']}\n"
            f"what it was made from:\n  {r['lineage_command']}"
        )

    emit(result, args.json, human)
    return 0


def add_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
