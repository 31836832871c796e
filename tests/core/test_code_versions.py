"""Code versions are tied to the code: changing a stage's source without bumping its
CODE_VERSION fails here, before an artifact id can name two contents."""

from __future__ import annotations

import shutil
from pathlib import Path

from aieng_core import code_versions


def copy_package(tmp_path: Path) -> Path:
    copy = tmp_path / "aieng_core"
    shutil.copytree(code_versions.PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def test_every_stage_version_is_locked_to_its_source() -> None:
    assert code_versions.problems() == []
    assert set(code_versions.STAGES) == set(code_versions.read_lock())


def test_a_stage_hashes_its_whole_import_closure() -> None:
    """clean_documents imports data/raw_documents.py (for snapshot_files): an edit there changes
    clean output, so the file is in clean_documents' hash. The closure follows function-level
    imports too (the report imports the engine inside its functions)."""
    clean = code_versions.stage_sources("clean_documents")
    assert "data/raw_documents.py" in clean and "data/readers.py" in clean and "data/jsonl_reader.py" in clean
    report = code_versions.stage_sources("benchmark_report")
    assert {"serving/engine.py", "serving/engine_loop.py", "model/llama.py", "training/trainer.py"} <= set(report)
    # What decides no byte is left out, and the closure does not go through it.
    assert not set(code_versions.EXCLUDED) & {
        f for stage in code_versions.STAGES for f in code_versions.stage_sources(stage)
    }


def test_every_excluded_module_exists() -> None:
    """An exclusion names a real file: a stale entry would hide nothing, a misspelt one would
    leave its module in every hash (both mean nobody reviewed the list)."""
    assert [path for path in code_versions.EXCLUDED if not (code_versions.PACKAGE / path).is_file()] == []


def test_an_edit_anywhere_in_the_closure_is_caught(tmp_path: Path, monkeypatch) -> None:
    copy = copy_package(tmp_path)
    raw = copy / "data" / "raw_documents.py"
    raw.write_text(raw.read_text(encoding="utf-8").replace('FILES_DIR = "files"', 'FILES_DIR = "landed"'), "utf-8")
    monkeypatch.setattr(code_versions, "PACKAGE", copy)
    assert sorted(problem.split(":")[0] for problem in code_versions.problems()) == [
        "clean_documents",
        "raw_documents",
    ]


def test_type_checking_imports_are_not_followed() -> None:
    tree = code_versions.ast.parse(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from aieng_core.serving.engine import Engine\n"
        "else:\n    import aieng_core.hashing\n"
        "def f():\n    from aieng_core.store import lineage\n"
    )
    assert code_versions.imported_modules(tree) == {
        "aieng_core.hashing",
        "aieng_core.store",
        "aieng_core.store.lineage",
    }


def test_a_code_change_without_a_version_bump_is_caught(tmp_path: Path, monkeypatch) -> None:
    copy = copy_package(tmp_path)
    cleaning = copy / "data" / "cleaning.py"
    cleaning.write_text(
        cleaning.read_text(encoding="utf-8").replace("MAX_COMBINING_RUN = 30", "MAX_COMBINING_RUN = 31"),
        encoding="utf-8",
    )
    monkeypatch.setattr(code_versions, "PACKAGE", copy)
    (problem,) = code_versions.problems()
    assert problem.startswith("clean_documents: its source changed but CODE_VERSION is still 'clean_documents-v3'")


def test_comments_docstrings_and_formatting_need_no_bump(tmp_path: Path, monkeypatch) -> None:
    copy = copy_package(tmp_path)
    readers = copy / "data" / "readers.py"
    source = readers.read_text(encoding="utf-8")
    source = source.replace('"""Reading landed files', '"""Reworded: reading landed files', 1)
    source = source.replace(
        "def is_data_file(name: str) -> bool:\n",
        "# a new comment\ndef is_data_file(name: str) -> bool:  # and another\n\n",
    )
    readers.write_text(source, encoding="utf-8")
    monkeypatch.setattr(code_versions, "PACKAGE", copy)
    assert code_versions.problems() == []


def edit_bpe_in_a_copy(tmp_path: Path, monkeypatch) -> Path:
    """Point code_versions at a copy of the package with tokenizer/bpe.py changed, and at a
    copy of the lock; returns the lock copy."""
    copy = copy_package(tmp_path)
    bpe = copy / "tokenizer" / "bpe.py"
    bpe.write_text(bpe.read_text(encoding="utf-8") + "\nEXTRA = 1\n", encoding="utf-8")
    lock_copy = tmp_path / "code_versions.json"
    shutil.copy(code_versions.LOCK_FILE, lock_copy)
    monkeypatch.setattr(code_versions, "PACKAGE", copy)
    monkeypatch.setattr(code_versions, "LOCK_FILE", lock_copy)
    return lock_copy


def test_lock_refuses_to_give_a_version_another_source(tmp_path: Path, monkeypatch) -> None:
    lock_copy = edit_bpe_in_a_copy(tmp_path, monkeypatch)
    before = lock_copy.read_bytes()
    refused = code_versions.lock()
    # Every stage whose import closure reaches tokenizer/bpe.py.
    assert {problem.split(":")[0] for problem in refused} == {
        "bpe_tokenizer",
        "tokenized_documents",
        "model_checkpoint",
        "benchmark_report",
        "serving_bundle",
        "serving_bundle_int8",
        "production_deployment",
    }
    assert lock_copy.read_bytes() == before  # nothing recorded


def test_a_same_behaviour_edit_is_recorded_only_when_claimed(tmp_path: Path, monkeypatch) -> None:
    edit_bpe_in_a_copy(tmp_path, monkeypatch)
    before = code_versions.read_lock()
    assert code_versions.lock(same_behaviour=True) == []
    after = code_versions.read_lock()
    assert code_versions.problems() == []
    version = code_versions.current_versions()["bpe_tokenizer"]
    # The original hash stays; the edit's hash is added beside it.
    assert after["bpe_tokenizer"][version] == [
        *before["bpe_tokenizer"][version],
        code_versions.source_sha256("bpe_tokenizer"),
    ]
    assert after["clean_documents"] == before["clean_documents"]
