"""Turning artifacts into what the Dagster UI shows: ids, inputs, counts, sample tables."""

from collections.abc import Callable, Sequence
from typing import Any

import dagster as dg

from aieng_core import asset_keys
from aieng_core.benchmark.inline_chart import bar_chart_svg, svg_data_uri
from aieng_core.hashing import sha256_json
from aieng_core.store import Artifact, ArtifactStore, RunInfo
from aieng_core.training.bits_per_byte import bits_per_byte, tokens_per_byte

PREVIEW_CHARS = 160
# The Dagster UI (1.13, ui-core MetadataEntry.tsx) renders a markdown value in the asset's
# metadata table only when it is shorter than this; a longer one hides behind "[Show Markdown]".
INLINE_MARKDOWN_CHARS = 1000


def run_info(context: dg.AssetExecutionContext | dg.AssetCheckExecutionContext) -> RunInfo:
    return RunInfo(dagster_run_id=context.run.run_id)


def artifact_metadata(artifact: Artifact) -> dict[str, Any]:
    """What every materialization says about the artifact it made or reused."""
    inputs = artifact.manifest.get("inputs", [])
    return {
        "artifact_id": artifact.id,
        "artifact_path": dg.MetadataValue.path(str(artifact.path)),
        "content_sha256": artifact.content_sha256,
        "reused": artifact.reused,
        "inputs": dg.MetadataValue.json(inputs),
        "input_ids": ", ".join(item["id"] for item in inputs) or "none",
    }


def _preview(value: Any) -> Any:
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="backslashreplace")
    if isinstance(value, str) and len(value) > PREVIEW_CHARS:
        return value[:PREVIEW_CHARS] + "…"
    return value


def table(rows: list[dict[str, Any]], columns: list[str]) -> dg.MetadataValue:
    """A sample table; long texts are cut to a preview."""
    schema = dg.TableSchema(
        columns=[
            dg.TableColumn(name, "int" if rows and isinstance(rows[0].get(name), int) else "string") for name in columns
        ]
    )
    records = [dg.TableRecord({name: _preview(row.get(name)) for name in columns}) for row in rows]
    return dg.MetadataValue.table(records=records, schema=schema)


def materialize_partitions(
    context: dg.AssetExecutionContext,
    build: Callable[[str], Artifact],
    describe: Callable[[Artifact], dict[str, Any]],
) -> dg.MaterializeResult:
    """Build each partition of the run (one, or a backfill range) with its own metadata.

    Dagster records one data version per step, so a range run gets the hash of its
    partitions' content hashes, while each partition's metadata carries its own
    `content_sha256`; a single-partition run's data version is exactly that hash.
    """
    artifacts = []
    for partition in context.partition_keys:
        artifact = build(partition)
        verb = "reused" if artifact.reused else "wrote"
        context.log.info(f"{context.asset_key.to_user_string()} {partition}: {verb} {artifact.id}")
        context.add_asset_metadata({**artifact_metadata(artifact), **describe(artifact)}, partition_key=partition)
        artifacts.append(artifact)
    if len(artifacts) == 1:
        version = artifacts[0].content_sha256
    else:
        version = sha256_json([[a.manifest["partition"], a.content_sha256] for a in artifacts])
    return dg.MaterializeResult(data_version=dg.DataVersion(version))


def numeric_order(name: str) -> tuple[str, int]:
    """Sort key: `…_batch_4` before `…_batch_16` (manifests store their keys sorted as text)."""
    stem, _, number = name.rpartition("_")
    return (stem, int(number)) if number.isdigit() else (name, 0)


def validation_bits_per_byte(store: ArtifactStore, model_id: str, loss: float) -> dict[str, float]:
    """`{"validation_bits_per_byte": …}`: a validation loss (nats/token) of the model_checkpoint
    `model_id` in bits per byte of its validation text; empty when that text is."""
    ratio = tokens_per_byte(store.get(asset_keys.MODEL_CHECKPOINT, model_id), store)
    return {} if ratio is None else {"validation_bits_per_byte": bits_per_byte(loss, ratio)}


def inline_chart(bars: Sequence[tuple[str, float]], caption: str) -> dg.MetadataValue | None:
    """A bar chart the asset page shows inline (markdown: an SVG data URI and its caption), or
    None when it would be too long to show inline (then it would only repeat the PNG plot)."""
    markdown = f"![{caption}]({svg_data_uri(bar_chart_svg(bars))})\n\n{caption}"
    return dg.MetadataValue.md(markdown) if bars and len(markdown) < INLINE_MARKDOWN_CHARS else None


def materialize_one(
    artifact: Artifact, describe: dict[str, Any], headline: dict[str, Any] | None = None
) -> dg.MaterializeResult:
    """`headline` comes first: the asset page lists metadata in order, and what on-call reads
    (the figures, the verdict) should be on screen without scrolling past ids and inputs."""
    return dg.MaterializeResult(
        data_version=dg.DataVersion(artifact.content_sha256),
        metadata={**(headline or {}), **artifact_metadata(artifact), **describe},
    )
