"""Decode step graphs captured at warmup (serving/step_graphs.py): greedy tokens equal to the
eager engine's and to transformers `generate`, a step runs in the smallest captured bucket,
nothing recompiles while serving, a restart loads the compiled code from the disk cache, and
capture that cannot happen says why while the engine runs eagerly. The captured engine
attends in groups of rows where the eager one it is compared with does not."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from aieng_core.serving.engine import Engine, EngineLimits
from aieng_core.serving.request import SamplingParams
from aieng_core.serving.step_graphs import COMPILE, EAGER, StepGraphSettings, batch_buckets
from tests.core.serving.test_engine import _mixed_prompts

MAX_BATCH = 4  # buckets 1, 2, 4: three compiles, a few seconds each


def captured_engine(model, tokenizer, cache_dir: Path, max_seconds: float = 300.0) -> Engine:
    limits = EngineLimits(MAX_BATCH, 64, 64, 512)
    settings = StepGraphSettings(mode=COMPILE, max_seconds=max_seconds, cache_dir=cache_dir)
    engine = Engine(model, tokenizer, limits, model.config.eos_token_id, settings, bundle_key="test-bundle")
    # Bucket 4 attends in two groups of two rows (each its own dynamic length), as a batch of
    # 32 or more does by default: the graphs below cover grouped attention too.
    engine.runner.graphs.min_group_rows = 2
    return engine


@pytest.fixture(scope="module")
def captured(tiny_model, tiny_tokenizer, tmp_path_factory):
    cache = tmp_path_factory.mktemp("step-graph-cache")
    engine = captured_engine(tiny_model, tiny_tokenizer, cache)
    figures = engine.warmup([4, 16])
    return engine, figures, cache


def test_buckets_are_powers_of_two_up_to_max_batch() -> None:
    assert batch_buckets(1) == [1]
    assert batch_buckets(4) == [1, 2, 4]
    assert batch_buckets(16) == [1, 2, 4, 8, 16]
    assert batch_buckets(48) == [1, 2, 4, 8, 16, 32, 48]


def test_warmup_captures_every_bucket_and_times_both_paths(captured) -> None:
    _, figures, cache = captured
    graphs = figures["step_graphs"]
    assert graphs["captured_buckets"] == [1, 2, 4]
    assert graphs["status"] == "captured: batch buckets [1, 2, 4] (torch.compile, inductor)"
    for bucket in graphs["buckets"]:
        assert bucket["captured"] is True
        assert bucket["capture_seconds"] > 0 and bucket["eager_step_ms"] > 0 and bucket["captured_step_ms"] > 0
    assert graphs["cache_dir"] == str(cache / f"torch-{torch.__version__}" / "test-bundle")
    assert any(Path(graphs["cache_dir"]).rglob("*.py")), "inductor wrote no compiled code to the cache"


@pytest.mark.parametrize("batch", [1, 3, 4])
def test_captured_greedy_tokens_equal_eager_and_transformers(captured, make_engine, trained_home, batch) -> None:
    from transformers import AutoModelForCausalLM

    engine, _, _ = captured
    eager = make_engine(max_batch=MAX_BATCH)
    prompts = _mixed_prompts(engine, batch)
    params = SamplingParams(max_new_tokens=24, ignore_eos=True)
    before = engine.runner.captured_steps
    outputs = engine.generate(prompts, params)
    # Every decode step ran captured: 23 per request after its prefill's first token, batched.
    assert engine.runner.captured_steps - before == 23
    assert [o.token_ids for o in outputs] == [o.token_ids for o in eager.generate(prompts, params)]
    reference = AutoModelForCausalLM.from_pretrained(trained_home.model.path).eval()
    reference.generation_config.eos_token_id = None
    for prompt, output in zip(prompts, outputs, strict=True):
        expected = reference.generate(
            torch.tensor([prompt]), max_new_tokens=24, do_sample=False, use_cache=True, pad_token_id=1
        )[0, len(prompt) :].tolist()
        assert list(output.token_ids) == expected


def test_serving_never_recompiles(captured) -> None:
    from torch._dynamo.utils import counters

    engine, _, _ = captured
    graphs_before = counters["stats"]["unique_graphs"]
    prompts = _mixed_prompts(engine, 4)
    # Every batch size 1..4 and attended lengths from 2 to the whole context.
    for count in (1, 2, 3, 4):
        engine.generate(prompts[:count], SamplingParams(max_new_tokens=40, ignore_eos=True))
    engine.generate([[engine.filler_token()]], SamplingParams(max_new_tokens=63, ignore_eos=True))
    assert counters["stats"]["unique_graphs"] == graphs_before


def test_a_restart_loads_the_compiled_code_from_the_disk_cache(captured, tiny_model, tiny_tokenizer) -> None:
    from torch._dynamo.utils import counters

    _, _, cache = captured
    torch._dynamo.reset()  # what a fresh process has: no compiled code in memory
    hits = counters["inductor"]["fxgraph_cache_hit"]
    restarted = captured_engine(tiny_model, tiny_tokenizer, cache)
    figures = restarted.warmup([4])["step_graphs"]
    assert figures["captured_buckets"] == [1, 2, 4]
    assert counters["inductor"]["fxgraph_cache_hit"] - hits == 3  # every bucket from the cache


def test_no_cpp_compiler_runs_eagerly_and_says_why(tiny_model, tiny_tokenizer, tmp_path, caplog) -> None:
    from torch._inductor import config as inductor_config

    engine = captured_engine(tiny_model, tiny_tokenizer, tmp_path)
    # The compilers inductor would try (it reads $CXX when torch is imported), patched its own way.
    with (
        inductor_config.patch({"cpp.cxx": (None, "no-such-compiler")}),
        caplog.at_level(logging.WARNING, logger="aieng.serving.step_graphs"),
    ):
        figures = engine.warmup([4])["step_graphs"]
    reason = "not captured: no C++ compiler ('no-such-compiler' not found on PATH) for inductor; steps run eagerly"
    assert figures["status"] == reason and figures["captured_buckets"] == []
    assert [b["reason"] for b in figures["buckets"]] == [reason] * 3
    assert any(reason in record.getMessage() for record in caplog.records)
    engine.generate([[engine.filler_token()]], SamplingParams(max_new_tokens=4, ignore_eos=True))
    assert engine.runner.captured_steps == 0


def test_the_warmup_bound_leaves_the_rest_eager(tiny_model, tiny_tokenizer, tmp_path) -> None:
    engine = captured_engine(tiny_model, tiny_tokenizer, tmp_path, max_seconds=0.0)
    figures = engine.warmup([4])["step_graphs"]
    assert figures["captured_buckets"] == []
    assert all(
        b["reason"].startswith("not captured: warmup spent 0 s of serving.warmup_max_seconds (0)")
        for b in figures["buckets"]
    )


def test_eager_mode_captures_nothing(make_engine) -> None:
    engine = make_engine(max_batch=MAX_BATCH)
    figures = engine.warmup([4])["step_graphs"]
    assert figures["mode"] == EAGER and figures["status"] == "not captured: serving.step_graphs is eager"


def test_the_engine_loop_thread_runs_the_graphs_warmup_captured(captured, make_engine) -> None:
    """The server warms up in one thread and steps in its engine loop's: the graphs captured in
    the first run in the second, with the same tokens as the eager engine."""
    import threading

    from aieng_core.serving.engine_loop import EngineLoop

    engine, _, _ = captured
    prompts = _mixed_prompts(engine, 4)
    params = SamplingParams(max_new_tokens=16, ignore_eos=True)
    expected = [o.token_ids for o in make_engine(max_batch=MAX_BATCH).generate(prompts, params)]
    finals: dict[int, object] = {}
    done = threading.Event()

    def sink_for(index: int):
        def sink(output) -> None:
            if output.finished:
                finals[index] = output
                if len(finals) == len(prompts):
                    done.set()

        return sink

    before = engine.runner.captured_steps
    loop = EngineLoop(engine).start()
    try:
        for index, prompt in enumerate(prompts):
            loop.submit(f"loop-{index}", prompt, params, sink_for(index))
        assert done.wait(60), "the loop did not finish the requests"
    finally:
        loop.stop()
    assert [finals[i].token_ids for i in range(len(prompts))] == expected
    assert engine.runner.captured_steps > before
