"""Code versions tied to the code: each stage's CODE_VERSION is locked to a hash of the
source that decides its content, and a test fails when that source changes while the
version does not.

Why a lock rather than a version derived from the source hash: a derived version changes on
every edit that changes the code at all, retraining the model for a renamed variable; a
lock keeps versions readable and bumped on purpose, and the test makes forgetting the bump
impossible. The hash is over each module's syntax tree without docstrings, so comments,
docstrings and reformatting never call for a bump.

`code_versions.json` beside this file keeps, per stage, every version ever locked with the
source hashes it names; a locked hash is never taken away. After a deliberate change of a
stage's behaviour: bump its CODE_VERSION, then run `python -m aieng_core.code_versions --lock`.
After a change that provably keeps every byte the stage writes (an import moved, a name
renamed, an annotation modernised): `--lock --same-behaviour` adds the new hash to the
version it already has. That is a claim a reviewer checks in the lock file's diff; when in
doubt, bump.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import json
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
LOCK_FILE = PACKAGE / "code_versions.json"

# The modules whose code decides each stage's artifact bytes or content hash (not the store,
# config loading or logging, which decide neither). Paths relative to aieng_core/.
STAGE_SOURCES: dict[str, tuple[str, tuple[str, ...]]] = {
    "raw_documents": ("aieng_core.data.raw_documents", ("data/raw_documents.py", "hashing.py")),
    "clean_documents": (
        "aieng_core.data.clean_documents",
        (
            "data/clean_documents.py",
            "data/readers.py",
            "data/byte_source.py",
            "data/lines.py",
            "data/record_count.py",
            "data/decoding.py",
            "data/cleaning.py",
            "data/contract.py",
            "data/reasons.py",
            "data/tables.py",
            "hashing.py",
        ),
    ),
    "bpe_tokenizer": (
        "aieng_core.tokenizer.bpe_tokenizer",
        ("tokenizer/bpe_tokenizer.py", "tokenizer/bpe.py", "hashing.py"),
    ),
    "tokenized_documents": (
        "aieng_core.tokenizer.tokenized_documents",
        ("tokenizer/tokenized_documents.py", "tokenizer/bpe.py", "data/tables.py", "hashing.py"),
    ),
    "dataset_manifest": (
        "aieng_core.dataset.dataset_manifest",
        ("dataset/dataset_manifest.py", "dataset/split.py", "data/tables.py", "hashing.py"),
    ),
    "model_checkpoint": (
        "aieng_core.training.model_checkpoint",
        (
            "training/model_checkpoint.py",
            "training/trainer.py",
            "training/corpus.py",
            "dataset/dataset_manifest.py",  # the token files' format, which corpus.py reads
            "model/llama.py",
            "model/hf_files.py",
            "model/weights.py",
            "model/memory.py",
            "model/shape.py",
            "dataset/split.py",
            "tokenizer/bpe.py",
            "hashing.py",
        ),
    ),
}


def _without_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                node.body = node.body[1:] or [ast.Pass()]
    return tree


def source_sha256(stage: str) -> str:
    """Hash of the code (syntax trees, docstrings dropped) of a stage's modules."""
    digest = hashlib.sha256()
    for relative in sorted(STAGE_SOURCES[stage][1]):
        tree = _without_docstrings(ast.parse((PACKAGE / relative).read_text(encoding="utf-8")))
        digest.update(relative.encode() + b"\0" + ast.dump(tree, include_attributes=False).encode() + b"\0")
    return digest.hexdigest()


def current_versions() -> dict[str, str]:
    return {stage: importlib.import_module(module).CODE_VERSION for stage, (module, _) in STAGE_SOURCES.items()}


def read_lock() -> dict[str, dict[str, list[str]]]:
    """stage -> version -> the source hashes locked to it (the first one, then same-behaviour edits)."""
    return json.loads(LOCK_FILE.read_text(encoding="utf-8")) if LOCK_FILE.exists() else {}


def problems() -> list[str]:
    """What is out of step between the code, its versions and the lock."""
    lock, found = read_lock(), []
    for stage, version in current_versions().items():
        locked = lock.get(stage, {}).get(version)
        source = source_sha256(stage)
        if not locked:
            found.append(
                f"{stage}: {version} is not in {LOCK_FILE.name}; run `python -m aieng_core.code_versions --lock`"
            )
        elif source not in locked:
            found.append(
                f"{stage}: its source changed but CODE_VERSION is still {version!r}; bump it (the artifacts it made "
                f"no longer match its code), then run `python -m aieng_core.code_versions --lock` (or, for an edit "
                f"that keeps every byte the stage writes, `--lock --same-behaviour`)"
            )
    return found


def lock(same_behaviour: bool = False) -> list[str]:
    """Record the current versions. A locked version gets another source hash only with
    same_behaviour=True (the caller's claim that the stage writes the same bytes)."""
    refused = [problem for problem in problems() if "source changed" in problem]
    if refused and not same_behaviour:
        return refused
    entries = read_lock()
    for stage, version in current_versions().items():
        hashes = entries.setdefault(stage, {}).setdefault(version, [])
        if source_sha256(stage) not in hashes:
            hashes.append(source_sha256(stage))
    LOCK_FILE.write_text(json.dumps(entries, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return []


if __name__ == "__main__":
    arguments = sys.argv[1:]
    found = lock(same_behaviour="--same-behaviour" in arguments) if "--lock" in arguments else problems()
    for problem in found:
        print(problem, file=sys.stderr)
    sys.exit(1 if found else 0)
