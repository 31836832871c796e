"""The commands that retrain the pinned tokenizer, as `aieng lineage --affected-by` and the
tokenizer_inputs_current check give them, run verbatim through the real `dagster` CLI: after
them the tokenizer is trained on what is current, and every partition and the dataset
manifest are on it."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from aieng_core.config import load_config
from aieng_core.data.clean_documents import build_clean_documents
from aieng_core.data.demo_data import land_demo_data
from aieng_core.data.raw_documents import build_raw_documents
from aieng_core.tokenizer.tokenizer_inputs import tokenizer_inputs_report
from tests.conftest import TINY_CONFIG
from tests.core.helpers import build_pipeline, jsonl, sentences
from tests.e2e.cli_helpers import AIENG, PARTITIONS, make_env

pytestmark = pytest.mark.e2e


def test_the_given_commands_retrain_and_retokenize(tmp_path: Path) -> None:
    env = make_env(tmp_path)
    land_demo_data(env.home)
    config = load_config(TINY_CONFIG)
    built = build_pipeline(env.home, config, PARTITIONS)
    with open(env.home / "raw" / "2026-01-01" / "documents.jsonl", "ab") as handle:
        handle.write(jsonl({"id": "late-1", "text": sentences(1, seed=9)[0]}))
    build_raw_documents(built.store, config, "2026-01-01")
    build_clean_documents(built.store, config, "2026-01-01")

    report = tokenizer_inputs_report(built.store)
    assert report["passed"] is False and report["counts"]["changed"] == 1
    lineage = json.loads(env.run_ok(AIENG, "lineage", "--affected-by", "2026-01-01", "--json").stdout)
    [via] = lineage["via_tokenizer"]
    assert via["bpe_tokenizer"] == built.tokenizer.id and via["replaced"] is True
    assert via["retrain"] == report["retrain"] and len(report["retrain"]) == 1

    for command in report["retrain"]:
        env.run_ok(*shlex.split(command))

    tokenizer = built.store.require_current("bpe_tokenizer")
    assert tokenizer.id != built.tokenizer.id
    assert tokenizer.input_ids("clean_documents") == [
        built.store.require_current("clean_documents", p).id for p in PARTITIONS
    ]
    after = tokenizer_inputs_report(built.store)
    assert after["passed"] is True and after["counts"] == {"unchanged": 3, "changed": 0, "gone": 0, "new": 0}
    for partition in PARTITIONS:
        tokenized = built.store.require_current("tokenized_documents", partition)
        assert tokenized.manifest["tokenizer_id"] == tokenizer.id, partition
    assert built.store.require_current("dataset_manifest").input_ids("bpe_tokenizer") == [tokenizer.id]
    text = env.run_ok(AIENG, "lineage", "--affected-by", "2026-01-01").stdout
    assert f"via bpe_tokenizer {tokenizer.id} (current; trained on this partition): " in text
    assert "retrain it" not in text  # the current tokenizer saw the day's current version
