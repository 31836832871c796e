"""Gate step 2: load the candidate where it will serve, warm it up, and measure what that costs.

In this process, on `serving.device` (auto: CUDA when present, else CPU): load the bundle,
time a first request right after the load (cold), run the engine's warmup generation for each
of `serving.warmup_prompt_lengths`, time the same request again (warm), and one one-token
forward (what readiness promises). Peak memory is measured against the memory budget rule
(model/memory.py: weights x 1.3 + 2 GiB): on CUDA torch.cuda.max_memory_allocated, on CPU the
growth of this process's resident set (sampled every few milliseconds). The engine's warmup
captures its decode step graphs (serving/step_graphs.py) as the server's does; the figures
give, per batch bucket, the capture time and the step time captured versus eager, or why a
bucket runs eagerly.
"""

from __future__ import annotations

import gc
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from aieng_core.config import AiengConfig
from aieng_core.cpu.quota import usable_cores
from aieng_core.gate.report import GateFailed
from aieng_core.serving.device import resolve_device

SAMPLE_EVERY_S = 0.005
# By bytes per parameter, the precision name of model/memory.py's budget.
PRECISION_BY_BYTES = {4: "fp32", 2: "bf16", 1: "int8"}


class PeakRss:
    """The largest resident set size of this process while the block runs (a sampling thread)."""

    def __init__(self) -> None:
        import psutil

        self._process = psutil.Process()
        self.before = self._process.memory_info().rss
        self.peak = self.before
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="aieng-gate-rss", daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._process.memory_info().rss)
            self._stop.wait(SAMPLE_EVERY_S)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._process.memory_info().rss)


def _timed_ms(engine: Any, prompt: str, params: Any) -> float:
    started = time.perf_counter()
    engine.generate([prompt], params)
    return (time.perf_counter() - started) * 1000.0


def _load_and_warm(
    bundle_path: Path, device: str, config: AiengConfig, figures: dict[str, Any]
) -> tuple[int, int, int]:
    """Load, time the first request cold, warm up, time it warm; (parameters, bytes per
    parameter, weights bytes). Everything it loaded is freed when it returns."""
    from aieng_core.bundle.verify import load_bundle
    from aieng_core.serving.request import SamplingParams

    serving = config.serving
    started = time.perf_counter()
    # Step 1 replayed the goldens; the bundle is immutable, its files are re-hashed here.
    bundle = load_bundle(bundle_path, device=device, check_goldens=False)
    engine = bundle.make_engine(max_waiting=serving.max_waiting, serving=serving)
    figures["load_seconds"] = time.perf_counter() - started
    probe = bundle.golden[0]
    new_tokens = max(1, min(int(probe["max_new_tokens"]), engine.limits.max_context - len(probe["prompt_ids"])))
    params = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True)
    figures["probe"] = {"prompt": probe["prompt"], "max_new_tokens": new_tokens}
    figures["cold_first_request_ms"] = _timed_ms(engine, probe["prompt"], params)
    started = time.perf_counter()
    warmup = engine.prepare_to_serve(serving.warmup_prompt_lengths)  # as the server does before readiness
    figures["warmup_seconds"] = time.perf_counter() - started
    figures["warmup_buckets"] = warmup["buckets"]
    figures["step_graphs"] = warmup["step_graphs"]
    figures["warm_first_request_ms"] = _timed_ms(engine, probe["prompt"], params)
    unique = list({id(p): p for p in bundle.model.parameters()}.values())
    return (
        sum(p.numel() for p in unique),
        unique[0].element_size(),
        sum(p.numel() * p.element_size() for p in unique),
    )


def warmup_step(bundle_path: Path, config: AiengConfig) -> dict[str, Any]:
    import torch

    from aieng_core.model.memory import budget_bytes as rule_bytes
    from aieng_core.serving.device import torch_threads

    device = resolve_device(config.serving.device)
    on_cuda = device.startswith("cuda")
    threads = config.serving.thread_counts(usable_cores())[0]  # the server's largest count
    figures: dict[str, Any] = {"device": device, "threads": threads}
    if on_cuda:
        torch.cuda.reset_peak_memory_stats()
    with torch_threads(threads), PeakRss() as rss:
        parameters, element_size, weights_bytes = _load_and_warm(bundle_path, device, config, figures)
        cuda_peak = int(torch.cuda.max_memory_allocated()) if on_cuda else None
    gc.collect()
    if on_cuda:
        torch.cuda.empty_cache()
    figures["warm_speedup"] = figures["cold_first_request_ms"] / max(figures["warm_first_request_ms"], 1e-9)
    precision = PRECISION_BY_BYTES.get(element_size, "fp32")
    budget_bytes = rule_bytes(parameters, precision)
    peak = cuda_peak if cuda_peak is not None else rss.peak - rss.before
    figures.update(
        parameters=parameters,
        precision=precision,
        weights_bytes=weights_bytes,
        rss_before_bytes=rss.before,
        rss_peak_bytes=rss.peak,
        rss_increase_bytes=rss.peak - rss.before,
        cuda_max_memory_allocated_bytes=cuda_peak,
        peak_memory_bytes=peak,
        peak_memory_measured_as="torch.cuda.max_memory_allocated" if on_cuda else "growth of this process's RSS",
        memory_budget_bytes=budget_bytes,
        memory_budget_rule=f"weights ({precision}) x 1.3 + 2 GiB (model/memory.py)",
        memory_budget_used=peak / budget_bytes,
    )
    if peak > budget_bytes:
        raise GateFailed(
            "warmup",
            "peak_memory_bytes",
            f"loading and warming the bundle on {device} took more memory than the budget rule allows "
            f"({figures['memory_budget_rule']}); shrink bundle.max_batch / max_context (the KV-cache pool) "
            "or serve on a larger device",
            value=peak,
            limit=budget_bytes,
            figures=figures,
        )
    return figures
