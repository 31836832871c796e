"""What is current in the artifact store: per asset, per partition, with the key counts."""

from __future__ import annotations

from typing import Any

from aieng_core.data.clean_documents import KIND as CLEAN_KIND
from aieng_core.data.raw_documents import KIND as RAW_KIND
from aieng_core.dataset.dataset_manifest import KIND as MANIFEST_KIND
from aieng_core.store import ArtifactStore
from aieng_core.tokenizer.bpe_tokenizer import KIND as TOKENIZER_KIND
from aieng_core.tokenizer.tokenized_documents import KIND as TOKENIZED_KIND
from aieng_core.training.model_checkpoint import KIND as MODEL_KIND

PARTITIONED = (RAW_KIND, CLEAN_KIND, TOKENIZED_KIND)
UNPARTITIONED = (TOKENIZER_KIND, MANIFEST_KIND, MODEL_KIND)


def pipeline_status(store: ArtifactStore) -> dict[str, Any]:
    status: dict[str, Any] = {"home": str(store.home), "assets": {}}
    for kind in PARTITIONED:
        status["assets"][kind] = {
            partition: _summary(store.require_current(kind, partition)) for partition in store.current_partitions(kind)
        }
    for kind in UNPARTITIONED:
        artifact = store.current(kind)
        status["assets"][kind] = _summary(artifact) if artifact else None
    return status


def _summary(artifact) -> dict[str, Any]:
    return {"id": artifact.id, "content_sha256": artifact.content_sha256, "path": str(artifact.path), "metrics": artifact.metrics}


def format_status(status: dict[str, Any]) -> str:
    assets = status["assets"]
    lines = [f"AIENG_HOME {status['home']}"]
    for kind in PARTITIONED:
        lines.append(f"{kind}:")
        if not assets[kind]:
            lines.append("  (none)")
        for partition, item in assets[kind].items():
            m = item["metrics"]
            counts = {
                RAW_KIND: lambda: f"{m['files']} files, {m['bytes']:,} bytes",
                CLEAN_KIND: lambda: f"{m['rows_in']} in, {m['rows_clean']} clean, {m['rows_quarantined']} quarantined",
                TOKENIZED_KIND: lambda: f"{m['rows']} documents, {m['tokens']:,} tokens",
            }[kind]()
            lines.append(f"  {partition}  {item['id']}  {counts}")
    tokenizer, manifest = assets[TOKENIZER_KIND], assets[MANIFEST_KIND]
    lines.append(f"{TOKENIZER_KIND}: " + (f"{tokenizer['id']}  vocabulary {tokenizer['metrics']['vocab_size']}" if tokenizer else "(none)"))
    if manifest:
        m = manifest["metrics"]
        lines.append(f"{MANIFEST_KIND}: {manifest['id']}  {m['partitions']} partitions, {m['rows']} documents, {m['tokens']:,} tokens")
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
        lines.append(f"  {model['path']}  (loads with transformers.AutoModelForCausalLM.from_pretrained)")
    else:
        lines.append(f"{MODEL_KIND}: (none)")
    return "\n".join(lines)
