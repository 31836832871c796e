"""`aieng store rebuild ID [--json]`: build that exact artifact again from its recorded recipe
(store/rebuild.py), its missing or damaged inputs first. Exit 0 when the id is present and
intact afterwards, 1 with a one-line error naming what stops it otherwise.

This module composes what the store layer may not import: each kind's builder, its code
version and the config sections it hashes. The builders, the config (pydantic) and everything
they need are imported inside the handler: `aieng` starts without them.
"""

from __future__ import annotations

import argparse
from typing import Any

from aieng_core import asset_keys
from aieng_core.home import raw_partition_dir, resolve_home
from aieng_core.output import emit
from aieng_core.store import ArtifactStore
from aieng_core.store.rebuild import Builder, RebuildRefused, format_rebuild, rebuild
from aieng_core.store.source_paths import readable


def cmd_store_rebuild(args: argparse.Namespace) -> int:
    store = ArtifactStore(resolve_home(args.home))
    result = rebuild(store, args.artifact_id, builders(), config_loader(args.config))
    emit(result, args.json, format_rebuild)
    return 0


def config_loader(path: str | None) -> Any:
    """The current config with a recipe's recorded section values put back (loaded once)."""
    from aieng_core.config import AiengConfig, load_config

    current = load_config(path)

    def config_for(sections: dict[str, Any] | None) -> Any:
        if not sections:
            return current
        # Validated as a whole, so the cross-section checks (context fits the model) still run.
        return AiengConfig.model_validate({**current.model_dump(mode="json"), **sections})

    return config_for


def builders() -> dict[str, Builder]:
    from aieng_core.benchmark import benchmark_report
    from aieng_core.bundle import serving_bundle
    from aieng_core.data import clean_documents, raw_documents
    from aieng_core.dataset import dataset_manifest
    from aieng_core.hashing import sha256_json
    from aieng_core.tokenizer import bpe_tokenizer, tokenized_documents
    from aieng_core.training import model_checkpoint

    def sections(*names: str) -> Any:
        return lambda config: config.section_sha256(*names)

    return {
        asset_keys.RAW_DOCUMENTS: Builder(
            raw_documents.CODE_VERSION,
            (),
            lambda config: sha256_json({}),
            # absent_ok: a day recorded without a landing folder is rebuilt as it was recorded.
            lambda store, config, recipe: raw_documents.build_raw_documents(
                store, config, recipe["partition"], absent_ok=True
            ),
            check=landed_files_unchanged,
        ),
        asset_keys.CLEAN_DOCUMENTS: Builder(
            clean_documents.CODE_VERSION,
            ("data",),
            sections("data"),
            lambda store, config, recipe: clean_documents.build_clean_documents(store, config, recipe["partition"]),
        ),
        asset_keys.BPE_TOKENIZER: Builder(
            bpe_tokenizer.CODE_VERSION,
            ("tokenizer",),
            sections("tokenizer"),
            # retrain: trained on the clean partitions the scratch refs name, never a pinned one.
            lambda store, config, recipe: bpe_tokenizer.build_bpe_tokenizer(store, config, retrain=True),
        ),
        asset_keys.TOKENIZED_DOCUMENTS: Builder(
            tokenized_documents.CODE_VERSION,
            ("tokenizer",),
            sections("tokenizer"),
            lambda store, config, recipe: tokenized_documents.build_tokenized_documents(
                store, config, recipe["partition"]
            ),
        ),
        asset_keys.DATASET_MANIFEST: Builder(
            dataset_manifest.CODE_VERSION,
            ("dataset",),
            sections("dataset"),
            lambda store, config, recipe: dataset_manifest.build_dataset_manifest(store, config),
        ),
        asset_keys.MODEL_CHECKPOINT: Builder(
            model_checkpoint.CODE_VERSION,
            ("model", "training"),
            sections("model", "training"),
            lambda store, config, recipe: model_checkpoint.build_model_checkpoint(store, config),
        ),
        asset_keys.BENCHMARK_REPORT: Builder(
            benchmark_report.CODE_VERSION,
            ("benchmark", "bundle", "training"),
            benchmark_report.report_config_sha256,
            lambda store, config, recipe: benchmark_report.build_benchmark_report(store, config),
        ),
        asset_keys.SERVING_BUNDLE: Builder(
            serving_bundle.CODE_VERSION,
            ("bundle",),
            serving_bundle.bundle_config_sha256,
            lambda store, config, recipe: serving_bundle.build_serving_bundle(store, config),
        ),
    }


def landed_files_unchanged(store: ArtifactStore, recipe: dict[str, Any]) -> None:
    """A raw snapshot is rebuilt only from the very bytes that landed: every file it recorded
    must still be in the landing folder with its sha256, and nothing else landed beside them."""
    from aieng_core.data.raw_documents import MissingPartitionData, landed_files
    from aieng_core.hashing import sha256_file

    recorded = (recipe.get("recipe") or {}).get("sources")
    if recorded is None:  # recorded from a manifest: the id check after the build decides
        return
    folder = raw_partition_dir(store.home, recipe["partition"])
    try:
        files, _ = landed_files(store.home, recipe["partition"])
    except MissingPartitionData:
        if recorded:
            raise RebuildRefused(
                f"its landing folder {folder} is gone; it snapshotted {len(recorded)} files there "
                f"({', '.join(source['name'] for source in recorded)}): restore them"
            ) from None
        return
    landed = {readable(path.name): path for path in files}
    for source in recorded:
        path = landed.get(source["name"])
        if path is None:
            raise RebuildRefused(
                f"landed file {folder / source['name']} (sha256 {source['sha256']}) is no longer there: restore it"
            )
        found = sha256_file(path)
        if found != source["sha256"]:
            raise RebuildRefused(
                f"landed file {path} has changed: its sha256 is {found}, the snapshot recorded {source['sha256']}; "
                "a raw snapshot is only rebuilt from the bytes that landed: restore that file"
            )
    extra = sorted(set(landed) - {source["name"] for source in recorded})
    if extra:
        raise RebuildRefused(
            f"{', '.join(extra)} landed in {folder} after the snapshot was taken; move them aside to rebuild it"
        )


def add_parser(store_commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = store_commands.add_parser(
        "rebuild",
        help="rebuild that exact artifact from its recorded recipe (inputs first); check the content is the same",
        description="Rebuild the artifact ID from the recipe recorded when it was built "
        "($AIENG_HOME/recipes/<kind>/<id>.json): the same code version, config section values and inputs "
        "(missing or damaged inputs are rebuilt first, the same way). The result must have the same id and "
        "content hash; no ref is changed. Exits 0 when ID is present and intact afterwards, 1 naming the "
        "input, code version, config section or content that stops it.",
    )
    parser.add_argument("artifact_id", metavar="ID", help="the artifact's id (any kind)")
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")
    parser.set_defaults(handler=cmd_store_rebuild)
