"""Whether the pinned tokenizer's inputs are still what is current, and the tokenizer's place
in what a partition or a landed file went into.

The tokenizer is pinned (bpe_tokenizer.py): replacing or removing a partition it was trained
on leaves it as it was, its vocabulary and merges still learned from the old text, and every
partition tokenized since was tokenized with it. Nothing rebuilds it on its own, because
retraining changes every token id: every partition is re-tokenized, and the dataset, the
model and its bundles after them are all new. So it is a decision, and this module gives
what it takes: `tokenizer_inputs_report` compares the clean_documents artifacts the current
tokenizer was trained on (and the raw snapshots they were cleaned from) with what each of
those partitions' refs name now, and gives the commands that retrain it; `affected_by`
adds to `aieng lineage --affected-by` the tokenizers a partition or file reached
(`via_tokenizer`; aieng_core/cli/lineage.py prints it).

Per partition: `unchanged`, `changed` (its current clean or raw artifact is another one than
the tokenizer was trained on: the ids of both, and the landed files whose SHA-256 differs),
`gone` (the partition was removed: no current clean_documents or raw_documents ref, or the
current raw snapshot of its landing folder holds no data, an empty day), or `new` (current
now with data, never seen by the tokenizer: expected of a pinned tokenizer, and no failure;
an empty day is not one, since a retrain leaves empty days out too).
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from aieng_core import asset_keys
from aieng_core.data.empty_day import has_no_data
from aieng_core.store import Artifact, ArtifactNotFound, ArtifactStore
from aieng_core.store.lineage import StoreIndex, index_store
from aieng_core.store.lineage import affected_by as store_affected_by

TOKENIZER_KIND = asset_keys.BPE_TOKENIZER
CLEAN_KIND = asset_keys.CLEAN_DOCUMENTS
RAW_KIND = asset_keys.RAW_DOCUMENTS

UNCHANGED, CHANGED, GONE, NEW = "unchanged", "changed", "gone", "new"
STATES = (UNCHANGED, CHANGED, GONE, NEW)

MATERIALIZE = "dagster asset materialize -m orchestration.definitions"
# The run config of orchestration/assets/tokenizer.py (TokenizerRunConfig): without it a
# materialization of bpe_tokenizer reuses the pinned one.
RETRAIN_CONFIG = '{"ops": {"bpe_tokenizer": {"config": {"retrain": true}}}}'
CONSEQUENCE = (
    "retraining changes every token id: every partition is re-tokenized, and the dataset_manifest, model and "
    "serving bundles built after it are all new"
)


# ---- the commands that retrain ----------------------------------------------------------------


def _blocks(partitions: list[str]) -> list[tuple[str, str]]:
    """Runs of consecutive days, (first, last) each: tokenized_documents needs a current clean
    artifact for every day of its range, so a range across a missing day would fail on it."""
    blocks: list[tuple[str, str]] = []
    for partition in sorted(partitions):
        day = dt.date.fromisoformat(partition)
        if blocks and dt.date.fromisoformat(blocks[-1][1]) + dt.timedelta(days=1) == day:
            blocks[-1] = (blocks[-1][0], partition)
        else:
            blocks.append((partition, partition))
    return blocks


def retrain_commands(partitions: list[str]) -> list[str]:
    """The `dagster asset materialize` commands that retrain the tokenizer on the clean text of
    `partitions` (those current now: a retrain trains on every one) and re-tokenize each of them
    with it, then refresh dataset_manifest, which refuses to mix tokenizers. One command when
    the partitions are consecutive days; one more per further run of days."""
    blocks = _blocks(partitions)
    if not blocks:
        return [f"{MATERIALIZE} --select {TOKENIZER_KIND} --config-json '{RETRAIN_CONFIG}'"]
    commands = []
    for number, (first, last) in enumerate(blocks):
        selection = [asset_keys.TOKENIZED_DOCUMENTS]
        if number == 0:
            selection.insert(0, TOKENIZER_KIND)
        if number == len(blocks) - 1:
            selection.append(asset_keys.DATASET_MANIFEST)
        where = f"--partition {first}" if first == last else f"--partition-range {first}...{last}"
        config = f" --config-json '{RETRAIN_CONFIG}'" if number == 0 else ""
        commands.append(f"{MATERIALIZE} --select {','.join(selection)} {where}{config}")
    return commands


# ---- one partition the tokenizer was trained on, against what is current now ----------------


def _manifest(store: ArtifactStore, kind: str, artifact_id: str | None) -> dict[str, Any] | None:
    if artifact_id is None:
        return None
    try:
        return store.get(kind, artifact_id).manifest
    except ArtifactNotFound:
        return None


def _current_id(store: ArtifactStore, kind: str, partition: str) -> str | None:
    artifact = store.current(kind, partition)
    return artifact.id if artifact is not None else None


def _sources(manifest: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """A raw snapshot's files by their name in the snapshot (older snapshots: the landed name)."""
    sources = manifest.get("sources") if manifest else None
    found = {}
    for source in sources if isinstance(sources, list) else []:
        if isinstance(source, dict) and isinstance(source.get("path"), str):
            found[source.get("name") or Path(source["path"]).name] = source
    return found


def files_that_differ(trained: dict[str, Any] | None, current: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The files of two raw snapshots whose SHA-256 differs, or that only one holds (its other
    sha256 is None), by name."""
    before, after = _sources(trained), _sources(current)
    differ = []
    for name in sorted(before.keys() | after.keys()):
        old, new = before.get(name, {}), after.get(name, {})
        if old.get("sha256") != new.get("sha256"):
            differ.append(
                {
                    "name": name,
                    "path": new.get("path") or old.get("path"),
                    "trained_sha256": old.get("sha256"),
                    "current_sha256": new.get("sha256"),
                }
            )
    return differ


def partition_state(store: ArtifactStore, partition: str, clean_id: str | None) -> dict[str, Any]:
    """`partition` as the tokenizer saw it (its clean_documents `clean_id`, and the raw snapshot
    that was cleaned) against the refs of the partition now."""
    clean = _manifest(store, CLEAN_KIND, clean_id)
    raw_ids = [item["id"] for item in (clean or {}).get("inputs", []) if item.get("kind") == RAW_KIND]
    trained = {CLEAN_KIND: clean_id, RAW_KIND: raw_ids[0] if raw_ids else None}
    current: dict[str, Artifact | None] = {kind: store.current(kind, partition) for kind in (CLEAN_KIND, RAW_KIND)}
    now = {kind: artifact.id if artifact else None for kind, artifact in current.items()}
    files: list[dict[str, Any]] = []
    missing = [kind for kind, artifact in current.items() if artifact is None]
    empty = [kind for kind, artifact in current.items() if artifact is not None and has_no_data(artifact)]
    if missing:
        state, why = GONE, f"no current {missing[0]} for {partition}: the partition was removed"
    elif empty:
        state = GONE
        why = f"{empty[-1]} {now[empty[-1]]} of {partition} holds no data (its landing folder is empty or absent now)"
    elif now == trained:
        state, why = UNCHANGED, f"clean_documents {clean_id} is still current"
    else:
        state = CHANGED
        parts = [f"clean_documents is now {now[CLEAN_KIND]}, trained on {clean_id}"]
        if now[RAW_KIND] != trained[RAW_KIND]:
            files = files_that_differ(
                _manifest(store, RAW_KIND, trained[RAW_KIND]), _manifest(store, RAW_KIND, now[RAW_KIND])
            )
            parts.append(f"raw_documents is now {now[RAW_KIND]}, trained on {trained[RAW_KIND]}")
            if files:
                parts.append(f"landed files that differ: {', '.join(f['name'] for f in files)}")
        else:
            parts.append("same raw snapshot: the cleaning changed (its code version or config)")
        why = "; ".join(parts)
    return {"partition": partition, "state": state, "trained_on": trained, "current": now, "files": files, "why": why}


# ---- the check: the current tokenizer's inputs ------------------------------------------------


def tokenizer_inputs_report(store: ArtifactStore) -> dict[str, Any]:
    """Every partition the current tokenizer was trained on, unchanged, changed or gone, and
    every partition current now that it never saw (new). `passed` when none changed or went;
    `retrain` the commands that retrain it (and re-tokenize), `consequence` what that costs."""
    tokenizer = store.require_current(TOKENIZER_KIND)
    clean_ids = tokenizer.input_ids(CLEAN_KIND)
    # training_partitions names the partitions in input order, for inputs since deleted.
    named = tokenizer.metrics.get("training_partitions") or []
    partitions = []
    for position, clean_id in enumerate(clean_ids):
        manifest = _manifest(store, CLEAN_KIND, clean_id)
        partition = manifest.get("partition") if manifest else (named[position] if position < len(named) else None)
        if isinstance(partition, str):
            partitions.append(partition_state(store, partition, clean_id))
    seen = {entry["partition"] for entry in partitions}
    current = store.current_partitions(CLEAN_KIND)
    for partition in current:
        clean = store.current(CLEAN_KIND, partition)
        if partition in seen or clean is None or has_no_data(clean):
            continue
        partitions.append(
            {
                "partition": partition,
                "state": NEW,
                "trained_on": {CLEAN_KIND: None, RAW_KIND: None},
                "current": {CLEAN_KIND: clean.id, RAW_KIND: _current_id(store, RAW_KIND, partition)},
                "files": [],
                "why": f"current clean_documents {clean.id}; the pinned tokenizer never saw it",
            }
        )
    partitions.sort(key=lambda entry: entry["partition"])
    counts = {state: sum(entry["state"] == state for entry in partitions) for state in STATES}
    return {
        "passed": counts[CHANGED] == counts[GONE] == 0,
        TOKENIZER_KIND: tokenizer.id,
        "partitions": partitions,
        "counts": counts,
        "retrain": retrain_commands(current),
        "consequence": CONSEQUENCE,
    }


def _named(report: dict[str, Any], state: str) -> list[str]:
    return [entry["partition"] for entry in report["partitions"] if entry["state"] == state]


def summary(report: dict[str, Any]) -> str:
    """One paragraph: what changed or went and the commands, or that every input is current."""
    counts, tokenizer_id = report["counts"], report[TOKENIZER_KIND]
    new = _named(report, NEW)
    unseen = f"; {len(new)} new partitions it never saw ({', '.join(new)}): expected, it is pinned" if new else ""
    if report["passed"]:
        return (
            f"bpe_tokenizer {tokenizer_id}: the {counts[UNCHANGED]} partitions it was trained on are unchanged{unseen}"
        )
    problems = [
        f"{label} ({', '.join(_named(report, state))})"
        for state, label in ((CHANGED, "changed"), (GONE, "gone"))
        if counts[state]
    ]
    commands = " then ".join(f"`{command}`" for command in report["retrain"])
    return (
        f"bpe_tokenizer {tokenizer_id} was trained on partitions that have since {' or '.join(problems)}{unseen}. "
        f"Retrain it: {commands}. Not blocking: {report['consequence']}"
    )


# ---- aieng lineage --affected-by: the path through the tokenizer -----------------------------


def via_tokenizer(store: ArtifactStore, index: StoreIndex, result: dict[str, Any]) -> list[dict[str, Any]]:
    """Each bpe_tokenizer among `result`'s artifacts (what `aieng_core.store.lineage.affected_by`
    found, with `index`): the partitions of the target it was trained on and their state now,
    and what was built with it. Every tokenized partition, whichever day, names the tokenizer
    as an input, so through it one partition reaches every token id."""
    affected = {(item["kind"], item["id"]) for item in result["artifacts"]}
    current = {artifact_id for kind, artifact_id in index.current if kind == TOKENIZER_KIND}
    found = []
    for kind, tokenizer_id in sorted(affected):
        if kind != TOKENIZER_KIND:
            continue
        inputs = index.manifests[(kind, tokenizer_id)].get("inputs") or []
        trained = []
        for item in inputs:
            key = (item.get("kind"), item.get("id"))
            if key in affected and key[0] == CLEAN_KIND:
                partition = index.manifests.get(key, {}).get("partition")
                if isinstance(partition, str):
                    trained.append(partition_state(store, partition, key[1]))
        built = index.downstream({(kind, tokenizer_id)}) & index.manifests.keys()
        built.discard((kind, tokenizer_id))
        is_current = tokenizer_id in current
        replaced = any(entry["state"] != UNCHANGED for entry in trained)
        found.append(
            {
                TOKENIZER_KIND: tokenizer_id,
                "current": is_current,
                "trained_on": trained,
                "replaced": replaced,
                "built_with_it": len(built),
                asset_keys.SERVING_BUNDLE: sorted(i for k, i in built if k == asset_keys.SERVING_BUNDLE),
                # Only the current one: the next build never uses an older tokenizer again.
                "retrain": retrain_commands(store.current_partitions(CLEAN_KIND)) if is_current and replaced else [],
            }
        )
    return found


def affected_by(store: ArtifactStore, target: str) -> dict[str, Any]:
    """`aieng_core.store.lineage.affected_by` plus `via_tokenizer`, from one pass over the store."""
    index = index_store(store)
    result = store_affected_by(store, target, index)
    return {**result, "via_tokenizer": via_tokenizer(store, index, result)}
