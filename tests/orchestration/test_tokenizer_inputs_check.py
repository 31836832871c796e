"""tokenizer_inputs_current, the non-blocking check on bpe_tokenizer, in a real Dagster instance:
it passes while the partitions the pinned tokenizer was trained on are current (a new day is
listed, not a failure), warns naming the partition, the file and the command once one is
re-landed and re-ingested, and passes again after that command's run."""

from __future__ import annotations

from pathlib import Path

import dagster as dg

from aieng_core.hashing import sha256_file
from aieng_core.store import ArtifactStore
from orchestration.assets.data import clean_documents, raw_documents
from orchestration.assets.dataset import dataset_manifest
from orchestration.assets.tokenizer import bpe_tokenizer, tokenized_documents, tokenizer_inputs_current
from tests.core.helpers import jsonl, sentences
from tests.orchestration.helpers import ASSETS, check_outcomes, range_tags, resources, run_materializations

DAY1, DAY2 = "2026-01-01", "2026-01-02"
RETRAIN = {"ops": {"bpe_tokenizer": {"config": {"retrain": True}}}}
COMMAND = (
    "dagster asset materialize -m orchestration.definitions --select bpe_tokenizer,tokenized_documents,"
    f"dataset_manifest --partition-range {DAY1}...{DAY2} "
    """--config-json '{"ops": {"bpe_tokenizer": {"config": {"retrain": true}}}}'"""
)


def evaluation_of(result: dg.ExecuteInProcessResult) -> dg.AssetCheckEvaluation:
    [evaluation] = [e for e in result.get_asset_check_evaluations() if e.check_name == "tokenizer_inputs_current"]
    return evaluation


def values(evaluation: dg.AssetCheckEvaluation) -> dict:
    return {key: value.value for key, value in evaluation.metadata.items()}


def rows(evaluation: dg.AssetCheckEvaluation) -> list[dict]:
    return [record.data for record in evaluation.metadata["partitions"].value.records]


def test_the_check_follows_the_tokenizers_inputs(demo_home: Path) -> None:
    store, res = ArtifactStore(demo_home), resources(demo_home)
    with dg.instance_for_test() as instance:

        def run(selection, **kwargs) -> dg.ExecuteInProcessResult:
            return dg.materialize(ASSETS, selection=selection, instance=instance, resources=res, **kwargs)

        first = run(ASSETS, partition_key=DAY1)
        assert first.success
        trained = store.require_current("bpe_tokenizer")
        assert evaluation_of(first).passed is True

        # A new day, ingested: listed as new, still passing (a pinned tokenizer never sees new days).
        assert run([raw_documents, clean_documents], partition_key=DAY2).success
        new_day = run(dg.AssetSelection.checks(tokenizer_inputs_current))
        evaluation = evaluation_of(new_day)
        assert evaluation.passed is True
        assert evaluation.description == (
            f"bpe_tokenizer {trained.id}: the 1 partitions it was trained on are unchanged; 1 new partitions it "
            f"never saw ({DAY2}): expected, it is pinned"
        )
        assert [(r["partition"], r["state"]) for r in rows(evaluation)] == [(DAY1, "unchanged"), (DAY2, "new")]

        # Day 1 re-landed with a changed file and re-ingested: the pinned tokenizer is reused, and warned of.
        landed = demo_home / "raw" / DAY1 / "documents.jsonl"
        before = sha256_file(landed)
        with open(landed, "ab") as handle:
            handle.write(jsonl({"id": "late-1", "text": sentences(1, seed=9)[0]}))
        old_clean = store.require_current("clean_documents", DAY1).id
        assert run([raw_documents, clean_documents], partition_key=DAY1).success
        new_clean = store.require_current("clean_documents", DAY1).id
        pinned = run([bpe_tokenizer])
        assert pinned.success  # not blocking: a WARN, not a failed run
        assert store.require_current("bpe_tokenizer").id == trained.id
        evaluation = evaluation_of(pinned)
        assert evaluation.passed is False
        assert evaluation.severity == dg.AssetCheckSeverity.WARN
        assert evaluation.description == (
            f"bpe_tokenizer {trained.id} was trained on partitions that have since changed ({DAY1}); 1 new "
            f"partitions it never saw ({DAY2}): expected, it is pinned. Retrain it: `{COMMAND}`. Not blocking: "
            "retraining changes every token id: every partition is re-tokenized, and the dataset_manifest, model "
            "and serving bundles built after it are all new"
        )
        found = values(evaluation)
        assert found["tokenizer_id"] == trained.id
        assert [found[f"partitions_{s}"] for s in ("unchanged", "changed", "gone", "new")] == [0, 1, 0, 1]
        assert found["retrain_commands"] == COMMAND
        [changed, _] = rows(evaluation)
        assert (changed["partition"], changed["state"], changed["files_changed"]) == (
            DAY1,
            "changed",
            "documents.jsonl",
        )
        assert (changed["trained_on"], changed["current"]) == (old_clean, new_clean)
        [detail] = [d for d in found["details"] if d["state"] == "changed"]
        assert detail["files"] == [
            {
                "name": "documents.jsonl",
                "path": str(landed),
                "trained_sha256": before,
                "current_sha256": sha256_file(landed),
            }
        ]

        # The command's run: the selection, range and run config it names, in one run.
        retrained = run(
            [bpe_tokenizer, tokenized_documents, dataset_manifest], run_config=RETRAIN, tags=range_tags(DAY1, DAY2)
        )
        assert retrained.success
        assert check_outcomes(retrained) == {
            "tokenizer_round_trips": True,
            "tokenizer_inputs_current": True,
            "tokenized_matches_clean": True,
            "dataset_manifest_intact": True,
        }
        tokenizer = store.require_current("bpe_tokenizer")
        assert tokenizer.id != trained.id and tokenizer.metrics["training_partitions"] == [DAY1, DAY2]
        assert set(run_materializations(retrained)) == {
            ("bpe_tokenizer", None),
            ("tokenized_documents", DAY1),
            ("tokenized_documents", DAY2),
            ("dataset_manifest", None),
        }
        assert store.require_current("dataset_manifest").input_ids("bpe_tokenizer") == [tokenizer.id]
