"""Goldens are the serving engine's greedy output, equal to the model's no-cache reference."""

from __future__ import annotations

import json

import pytest
import torch

from aieng_core.bundle.golden import replay_goldens
from aieng_core.bundle.serving_bundle import GOLDEN_FILE
from aieng_core.model.hf_files import load_model
from aieng_core.serving.device import torch_threads
from aieng_core.serving.engine import Engine, EngineLimits
from aieng_core.serving.greedy import greedy_continuations
from aieng_core.tokenizer.bpe import load_tokenizer
from tests.bundle_fixtures import BundledHome


def goldens(bundled: BundledHome) -> dict:
    return json.loads(bundled.bundle.file(GOLDEN_FILE).read_text(encoding="utf-8"))


def test_goldens_equal_the_models_greedy_reference(serving_bundle_artifact: BundledHome) -> None:
    doc = goldens(serving_bundle_artifact)
    model = load_model(serving_bundle_artifact.model)
    tokenizer = load_tokenizer(serving_bundle_artifact.model.path)
    eos = model.config.eos_token_id
    with torch_threads(doc["threads"]):
        for golden in doc["outputs"]:
            assert golden["prompt_ids"] == tokenizer.encode(golden["prompt"], add_special_tokens=False).ids
            prompt = torch.tensor([golden["prompt_ids"]])
            reference = model.generate_greedy(prompt, golden["max_new_tokens"])[0, prompt.shape[1] :].tolist()
            got = golden["token_ids"]
            assert got == reference[: len(got)], golden["prompt"]
            if golden["finish_reason"] == "length":
                assert len(got) == golden["max_new_tokens"]
            else:  # stopped at EOS, which is the last token recorded
                assert (golden["finish_reason"], got[-1]) == ("stop", eos)
            text_ids = [t for t in got if t != eos]
            assert golden["text"] == bytes(tokenizer.decode(text_ids).encode("utf-8")).decode("utf-8")


def test_recording_is_independent_of_the_batch(serving_bundle_artifact: BundledHome) -> None:
    """One prompt alone gives the same continuation as in the recorded batch of all prompts."""
    doc = goldens(serving_bundle_artifact)
    model = load_model(serving_bundle_artifact.model)
    engine = Engine(
        model, load_tokenizer(serving_bundle_artifact.model.path), EngineLimits(1, 64, 1, 64), model.config.eos_token_id
    )
    with torch_threads(doc["threads"]):
        for golden in doc["outputs"]:
            [alone] = greedy_continuations(engine, [golden["prompt"]], golden["max_new_tokens"])
            # A conversation's entry also keeps the messages its prompt was rendered from.
            assert alone == {key: value for key, value in golden.items() if key != "messages"}


def test_replay_flags_exactly_the_changed_golden(serving_bundle_artifact: BundledHome) -> None:
    doc = goldens(serving_bundle_artifact)
    changed = [dict(g) for g in doc["outputs"]]
    changed[1]["token_ids"] = [changed[1]["token_ids"][0] + 1, *changed[1]["token_ids"][1:]]
    model = load_model(serving_bundle_artifact.model)
    engine = Engine(
        model,
        load_tokenizer(serving_bundle_artifact.model.path),
        EngineLimits(**doc["engine_limits"]),
        model.config.eos_token_id,
    )
    with torch_threads(doc["threads"]):
        results = replay_goldens(engine, changed)
    # The prompts, then the two golden conversations (replayed without a template here: their
    # prompts are still generated, but nothing can render them again, so they fail).
    assert [r["ok"] for r in results] == [True, False, True, False, False]
    assert [r["conversation"] for r in results] == [False, False, False, True, True]
    assert [r["rendered_match"] for r in results] == [True, True, True, False, False]
    assert results[1]["got_token_ids"] == doc["outputs"][1]["token_ids"]
    assert results[1]["expected_token_ids"] == changed[1]["token_ids"]
    assert replay_goldens(engine, []) == []


@pytest.mark.parametrize("threads", [1, 3])
def test_torch_threads_restores_the_count(threads: int) -> None:
    before = torch.get_num_threads()
    with torch_threads(threads):
        assert torch.get_num_threads() == threads
    assert torch.get_num_threads() == before
