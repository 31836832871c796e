"""`aieng model train`: train model_checkpoint on the current dataset_manifest (or reuse it)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from aieng_core.home import resolve_home
from aieng_core.output import emit
from aieng_core.store import ArtifactStore


def cmd_model_train(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from aieng_core.config import load_config  # pydantic: only for commands that read the config
    from aieng_core.training.model_checkpoint import build_model_checkpoint

    config = load_config(args.config)
    # Ranks of a data-parallel run are other processes: rank 0's progress lines are the progress.
    quiet = args.no_progress or config.training.processes > 1
    with tqdm(total=config.training.max_steps, desc="training", unit="step", file=sys.stderr, disable=quiet) as bar:

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


def add_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    model = commands.add_parser("model", help="the language model")
    model_commands = model.add_subparsers(dest="model_command", required=True, metavar="SUBCOMMAND")
    train = model_commands.add_parser(
        "train", help="train model_checkpoint on the current dataset_manifest (or reuse it)"
    )
    train.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    train.add_argument("--json", action="store_true")
    train.set_defaults(handler=cmd_model_train)
