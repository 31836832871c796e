"""Small builders shared by the core tests: record encoders, a whole-pipeline build, and a
broken (lowercasing) tokenizer artifact."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from tokenizers import normalizers

from aieng_core.config import AiengConfig, TokenizerConfig
from aieng_core.data.clean_documents import build_clean_documents
from aieng_core.data.raw_documents import build_raw_documents
from aieng_core.dataset.dataset_manifest import build_dataset_manifest
from aieng_core.hashing import sha256_json
from aieng_core.store import Artifact, ArtifactSpec, ArtifactStore, Produced
from aieng_core.tokenizer.bpe import save_tokenizer_dir, train_bpe
from aieng_core.tokenizer.bpe_tokenizer import KIND as TOKENIZER_KIND
from aieng_core.tokenizer.bpe_tokenizer import build_bpe_tokenizer
from aieng_core.tokenizer.tokenized_documents import build_tokenized_documents


@dataclass
class BuiltHome:
    home: Path
    store: ArtifactStore
    config: AiengConfig
    raw: dict[str, Artifact]
    clean: dict[str, Artifact]
    tokenizer: Artifact
    tokenized: dict[str, Artifact]
    dataset: Artifact


def build_data(store: ArtifactStore, config: AiengConfig, partitions: list[str]) -> dict[str, Artifact]:
    """raw_documents + clean_documents for each partition, in the order given."""
    clean = {}
    for partition in partitions:
        build_raw_documents(store, config, partition)
        clean[partition] = build_clean_documents(store, config, partition)
    return clean


def build_pipeline(home: Path, config: AiengConfig, partitions: list[str]) -> BuiltHome:
    store = ArtifactStore(home)
    raw, clean, tokenized = {}, {}, {}
    for partition in partitions:
        raw[partition] = build_raw_documents(store, config, partition)
        clean[partition] = build_clean_documents(store, config, partition)
    tokenizer = build_bpe_tokenizer(store, config)
    for partition in partitions:
        tokenized[partition] = build_tokenized_documents(store, config, partition)
    dataset = build_dataset_manifest(store, config)
    return BuiltHome(home, store, config, raw, clean, tokenizer, tokenized, dataset)


def json_line(record: Any, encoding: str = "utf-8") -> bytes:
    return json.dumps(record, ensure_ascii=False).encode(encoding) + b"\n"


def jsonl(*records: Any) -> bytes:
    """JSONL bytes; a bytes item is taken as one raw line (a newline is added)."""
    return b"".join(r + b"\n" if isinstance(r, bytes) else json_line(r) for r in records)


def read_table(path: Path) -> list[dict[str, Any]]:
    return pq.read_table(path).to_pylist()


WORDS = (
    "data pipeline tokenizer token artifact manifest partition quarantine clean raw text "
    "model training lineage hash version serving bundle deploy rollback metric alert batch "
    "stream record schema contract encoding decode byte merge vocabulary split train"
).split()


def sentences(count: int, seed: int = 0) -> list[str]:
    """Deterministic English-like sentences, distinct from each other, 40+ characters."""
    out = []
    for i in range(count):
        a, b, c, d = (WORDS[(i * k + seed * 7 + k) % len(WORDS)] for k in (1, 3, 5, 11))
        out.append(f"Document {seed}-{i} says the {a} feeds the {b}, then the {c} checks every {d}.")
    return out


@dataclass
class Cleaned:
    metrics: dict[str, Any]
    content_sha256: str
    clean: list[dict[str, Any]]
    quarantine: list[dict[str, Any]]

    @property
    def reasons(self) -> dict[str, int]:
        """The non-zero reason counts."""
        return {reason: count for reason, count in self.metrics["reasons"].items() if count}

    def texts(self) -> dict[str, str]:
        return {row["id"]: row["text"] for row in self.clean}


def clean_files(directory: Path, files: dict[str, bytes], config) -> Cleaned:
    """Write `files` into directory/landed and run clean_partition over them (sorted by name)."""
    from aieng_core.data.clean_documents import clean_partition

    landed = directory / "landed"
    landed.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (landed / name).write_bytes(data)
    out = directory / "out"
    out.mkdir(parents=True, exist_ok=True)
    produced = clean_partition([(name, landed / name) for name in sorted(files)], config, out)
    return Cleaned(
        produced.metrics,
        produced.content_sha256,
        read_table(out / "clean.parquet"),
        read_table(out / "quarantine.parquet"),
    )


def lowercasing_tokenizer(store: ArtifactStore, texts: list[str]) -> None:
    """Make the current tokenizer one that lowercases before encoding, so that any text with
    a capital letter cannot round-trip: a real, broken tokenizer artifact."""
    config = TokenizerConfig(vocab_size=300, min_frequency=1)

    def produce(staging: Path) -> Produced:
        tokenizer = train_bpe(iter(texts), config)
        tokenizer.normalizer = normalizers.Lowercase()
        save_tokenizer_dir(tokenizer, staging, config)
        return Produced(content_sha256=sha256_json("lowercasing"))

    store.build(ArtifactSpec(kind=TOKENIZER_KIND, code_version="lowercasing", config_sha256="0" * 64), produce)
