"""What is current in the artifact store: per asset, per partition, with the key counts."""

from __future__ import annotations

import datetime as dt
from typing import Any

from aieng_core.asset_keys import BENCHMARK_REPORT as BENCHMARK_KIND
from aieng_core.asset_keys import BPE_TOKENIZER as TOKENIZER_KIND
from aieng_core.asset_keys import CLEAN_DOCUMENTS as CLEAN_KIND
from aieng_core.asset_keys import DATASET_MANIFEST as MANIFEST_KIND
from aieng_core.asset_keys import MODEL_CHECKPOINT as MODEL_KIND
from aieng_core.asset_keys import RAW_DOCUMENTS as RAW_KIND
from aieng_core.asset_keys import SERVING_BUNDLE as BUNDLE_KIND
from aieng_core.asset_keys import TOKENIZED_DOCUMENTS as TOKENIZED_KIND
from aieng_core.store import ArtifactStore

PARTITIONED = (RAW_KIND, CLEAN_KIND, TOKENIZED_KIND)
UNPARTITIONED = (TOKENIZER_KIND, MANIFEST_KIND, MODEL_KIND, BENCHMARK_KIND, BUNDLE_KIND)
# One line of counts per partition, from the artifact's metrics.
PARTITION_SUMMARY = {
    RAW_KIND: lambda m: f"{m['files']} files, {m['bytes']:,} bytes",
    CLEAN_KIND: lambda m: f"{m['rows_in']} in, {m['rows_clean']} clean, {m['rows_quarantined']} quarantined",
    TOKENIZED_KIND: lambda m: f"{m['rows']} documents, {m['tokens']:,} tokens",
}
# What an empty day's artifacts say instead of their counts.
NO_DATA = {"empty": "no data: empty landing folder", "absent": "no data: no landing folder (ingested in a range)"}
INGESTED = "ingested"  # as aieng_core/data/landing.py names it (imported lazily: status stays light)


def pipeline_status(store: ArtifactStore, start_date: dt.date, today: dt.date | None = None) -> dict[str, Any]:
    """`today` (UTC) decides which landing folder is still today's: now's by default."""
    today = today or dt.datetime.now(dt.UTC).date()
    landing = landing_status(store, today, start_date)
    status: dict[str, Any] = {"home": str(store.home), "assets": {}, "landing": landing}
    for kind in PARTITIONED:
        status["assets"][kind] = {
            partition: _summary(store.require_current(kind, partition)) for partition in store.current_partitions(kind)
        }
    for kind in UNPARTITIONED:
        artifact = store.current(kind)
        status["assets"][kind] = _summary(artifact) if artifact else None
    return status


def landing_status(store: ArtifactStore, today: dt.date, start_date: dt.date) -> dict[str, Any]:
    """Every landing folder: `{partition: {files, state}}`, state in the landing sensor's words
    (aieng_core/data/landing.py `landing_state`: ingested, partly ingested, changed since
    ingested, emptied since ingested, not ingested, not a partition until the day ends, before
    data.start_date); `other_entries`: what raw/ holds that is no partition's folder. A day
    with neither folder nor snapshot is simply not listed."""
    from aieng_core.data.landing import landing_folders, landing_state

    folders, strays = landing_folders(store.home)
    partitions = {
        folder.partition: {"files": len(folder.files), "state": landing_state(store, folder, today, start_date)}
        for folder in folders
    }
    return {"partitions": partitions, "other_entries": strays}


def _summary(artifact) -> dict[str, Any]:
    metrics = artifact.metrics
    return {
        "id": artifact.id,
        "content_sha256": artifact.content_sha256,
        "path": str(artifact.path),
        "no_data": bool(metrics.get("no_data", False)),
        "metrics": metrics,
    }


def _partition_line(kind: str, item: dict[str, Any], raw: dict[str, Any] | None) -> str:
    if item["no_data"]:
        landing = (raw or {}).get("metrics", {}).get("landing_folder", "empty")
        return NO_DATA.get(landing, NO_DATA["empty"])
    return PARTITION_SUMMARY[kind](item["metrics"])


def format_status(status: dict[str, Any]) -> str:
    assets = status["assets"]
    lines = [f"AIENG_HOME {status['home']}"]
    for kind in PARTITIONED:
        lines.append(f"{kind}:")
        if not assets[kind]:
            lines.append("  (none)")
        for partition, item in assets[kind].items():
            raw = assets[RAW_KIND].get(partition)
            lines.append(f"  {partition}  {item['id']}  {_partition_line(kind, item, raw)}")
    landing = status["landing"]
    waiting = {p: entry for p, entry in landing["partitions"].items() if entry["state"] != INGESTED}
    lines.append(
        f"landing folders ({len(landing['partitions'])}, $AIENG_HOME/raw/): {len(waiting)} not ingested as landed"
    )
    for partition, entry in waiting.items():
        lines.append(f"  {partition}  {entry['files']} data files  {entry['state']}")
    if landing["other_entries"]:
        lines.append(f"  not partitions, never ingested: {', '.join(landing['other_entries'])}")
    tokenizer, manifest = assets[TOKENIZER_KIND], assets[MANIFEST_KIND]
    lines.append(
        f"{TOKENIZER_KIND}: "
        + (f"{tokenizer['id']}  vocabulary {tokenizer['metrics']['vocab_size']}" if tokenizer else "(none)")
    )
    if manifest:
        m = manifest["metrics"]
        lines.append(
            f"{MANIFEST_KIND}: {manifest['id']}  {m['partitions']} partitions, {m['rows']} documents, "
            f"{m['tokens']:,} tokens"
        )
        lines.append(f"  data version (content sha256) {manifest['content_sha256']}")
        lines.append(f"  {manifest['path']}")
    else:
        lines.append(f"{MANIFEST_KIND}: (none)")
    model = assets[MODEL_KIND]
    if model:
        m = model["metrics"]
        lines.append(
            f"{MODEL_KIND}: {model['id']}  {m['parameters']:,} parameters, {m['steps']} steps, validation loss "
            f"{m['validation_loss']:.3f} vs unigram baseline {m['unigram_baseline_loss']:.3f} nats/token"
        )
        if m.get("partial"):
            lines.append(
                f"  PARTIAL: stopped by {m['stopped_by']} after {m['steps']} of {m['max_steps']} steps; "
                "materialize model_checkpoint again to resume"
            )
        lines.append(f"  {model['path']}  (loads with transformers.AutoModelForCausalLM.from_pretrained)")
    else:
        lines.append(f"{MODEL_KIND}: (none)")
    lines.append(_benchmark_line(assets[BENCHMARK_KIND]))
    bundle = assets[BUNDLE_KIND]
    if bundle:
        lines.append(
            f"{BUNDLE_KIND}: {bundle['id']}  (model_checkpoint {bundle['metrics'].get('model_checkpoint_id')})"
        )
        lines.append(f"  {bundle['path']}  (aieng serve --bundle PATH; `aieng bundle current` prints how to query it)")
    else:
        lines.append(f"{BUNDLE_KIND}: (none)")
    return "\n".join(lines)


def _benchmark_line(report: dict[str, Any] | None) -> str:
    if not report:
        return f"{BENCHMARK_KIND}: (none)"
    m = report["metrics"]
    parts = [f"{BENCHMARK_KIND}: {report['id']}  (model_checkpoint {m.get('model_checkpoint_id')})"]
    if "validation_loss" in m:
        parts.append(f"validation loss {m['validation_loss']:.3f} vs unigram {m['unigram_baseline_loss']:.3f}")
    speeds = sorted(
        (int(name.rsplit("_", 1)[1]), value) for name, value in m.items() if name.startswith("tokens_per_second_batch_")
    )
    if speeds:
        size, value = speeds[-1]
        ratio = m.get(f"ratio_vs_transformers_batch_{size}")
        parts.append(f"{value:,.0f} tok/s at batch {size}" + (f" ({ratio:.2f}x transformers)" if ratio else ""))
    if m.get("truncated"):
        parts.append("TRUNCATED by benchmark.max_seconds")
    return ", ".join(parts)
