"""The engine at every thread count the server's governor may pick (cpu/governor.py), and
nothing new after ready (issue 39): warmup captures each batch bucket's decode step at each
count and runs, per bucket and count, what real traffic does first; then a loop whose thread
count changes under it, at every batch size, greedy and sampled, compiles no graph, allocates
no KV-cache tensor, and runs every decode step in a captured graph, with the same greedy
tokens at every count as the eager engine."""

from __future__ import annotations

import threading

import pytest
import torch

from aieng_core.cpu.governor import ThreadGovernor
from aieng_core.cpu.usage import CpuUse
from aieng_core.serving import kv_cache
from aieng_core.serving.engine import Engine, EngineLimits
from aieng_core.serving.engine_loop import EngineLoop
from aieng_core.serving.request import SamplingParams
from aieng_core.serving.step_graphs import COMPILE, StepGraphSettings
from tests.core.serving.test_engine import _mixed_prompts

MAX_BATCH = 2  # buckets 1, 2 at 2 and 1 threads: four compiles
COUNTS = (2, 1)


@pytest.fixture(scope="module")
def ready(tiny_model, tiny_tokenizer, tmp_path_factory):
    """An engine as a server has it when /health/ready turns 200 (prepare_to_serve done)."""
    limits = EngineLimits(MAX_BATCH, 64, 64, 48)
    settings = StepGraphSettings(mode=COMPILE, cache_dir=tmp_path_factory.mktemp("graphs"), thread_counts=COUNTS)
    engine = Engine(tiny_model, tiny_tokenizer, limits, tiny_model.config.eos_token_id, settings, "threads-test")
    warmup = engine.prepare_to_serve([4, 16])
    return engine, warmup


def test_warmup_captures_every_bucket_at_every_count(ready) -> None:
    _, warmup = ready
    graphs = warmup["step_graphs"]
    assert graphs["status"] == "captured: batch buckets [1, 2] at 2 and 1 threads (torch.compile, inductor)"
    assert graphs["captured_by_threads"] == {"2": [1, 2], "1": [1, 2]}
    assert [(b["threads"], b["batch"]) for b in graphs["buckets"]] == [(n, b) for n in COUNTS for b in (1, 2)]


def test_warmup_runs_a_packed_prefill_and_decode_steps_per_bucket_and_count(ready) -> None:
    _, warmup = ready
    # max_prefill_tokens 48: each bucket's prompts fill one prefill step between them.
    assert [(b["threads"], b["batch"], b["prompt_tokens"]) for b in warmup["batches"]] == [
        (n, batch, tokens) for n in COUNTS for batch, tokens in ((1, 48), (2, 24))
    ]
    assert all(b["new_tokens"] == 8 for b in warmup["batches"])


class Neighbour:
    """What a sampler would measure: a busy process that comes and goes as the test says."""

    def __init__(self) -> None:
        self.others = 0.0

    def sample(self) -> CpuUse:
        return CpuUse(0.25, self.others, 1.0)


def test_nothing_is_compiled_or_allocated_after_ready_whatever_the_thread_count(ready, make_engine) -> None:
    from torch._dynamo.utils import counters

    engine, _ = ready
    graphs_before, tensors_before = counters["stats"]["unique_graphs"], kv_cache.allocations()
    eager_before, captured_before = engine.runner.eager_steps, engine.runner.captured_steps
    neighbour = Neighbour()
    clock = [0.0]
    governor = ThreadGovernor(COUNTS, neighbour, interval_s=0.25, up_after_s=0.5, clock=lambda: clock[0])  # type: ignore[arg-type]
    seen_threads: list[int] = []
    loop = EngineLoop(
        engine, on_step=lambda step, stats: seen_threads.append(torch.get_num_threads()), threads=governor
    )
    prompts = _mixed_prompts(engine, MAX_BATCH)
    greedy = SamplingParams(max_new_tokens=12, ignore_eos=True)
    sampled = SamplingParams(max_new_tokens=12, ignore_eos=True, temperature=0.9, top_p=0.9, seed=5)
    finals: dict[tuple[int, int, int], tuple[int, ...]] = {}
    loop.start()
    try:
        for phase, others in enumerate((0.0, 1.0, 0.0)):  # quiet, a busy neighbour, quiet again
            neighbour.others = others
            clock[0] += 1.0  # a second of samples saying so: the governor follows
            for count in range(1, MAX_BATCH + 1):  # every batch size
                done = threading.Event()
                results: dict[int, tuple[int, ...]] = {}

                def sink_for(index: int, results=results, done=done, count=count):
                    def sink(output) -> None:
                        if output.finished:
                            results[index] = output.token_ids
                            if len(results) == count:
                                done.set()

                    return sink

                clock[0] += 0.25
                for index in range(count):
                    params = greedy if index % 2 == 0 else sampled
                    loop.submit(f"p{phase}-{count}-{index}", prompts[index], params, sink_for(index))
                assert done.wait(60), "the loop did not finish the requests"
                finals.update({(phase, count, i): ids for i, ids in results.items()})
    finally:
        loop.stop()
    assert set(seen_threads) == {1, 2}, "the governor's count did not reach the steps"
    assert counters["stats"]["unique_graphs"] == graphs_before  # no graph compiled after ready
    assert kv_cache.allocations() == tensors_before  # no KV-cache tensor allocated after ready
    assert engine.runner.eager_steps == eager_before  # every decode step ran in a captured graph
    assert engine.runner.captured_steps > captured_before
    # Greedy tokens are the same at 2 threads, at 1 and in the eager engine.
    eager = make_engine(max_batch=MAX_BATCH).generate(prompts, greedy)
    for phase in range(3):
        for count in range(1, MAX_BATCH + 1):
            for index in range(0, count, 2):
                assert finals[(phase, count, index)] == eager[index].token_ids
