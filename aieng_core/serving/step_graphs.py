"""Decode steps as compiled graphs, one per batch-size bucket, captured during warmup.

At this model's size a decode step is a few hundred small operator calls, and dispatching
each from Python costs more than its arithmetic (the seeds' section on operator fusion and
CUDA graphs). So, as vLLM and nano-vllm capture a CUDA graph per batch size, the engine
compiles `LlamaForCausalLM.decode_forward` once per bucket of batch sizes (1, 2, 4, ...,
max_batch) with torch.compile (inductor: fused C++ kernels on the CPU), and a step runs in the
smallest bucket that holds its rows; the rows above it are idle rows (model_runner.py), so the
graph's batch is static, and so are its attention groups (model/decode_attention.py: a bucket's
rows split the same way every step). Each group's attended length is the one dimension left
dynamic (2 to max_context): one graph serves every length without attending padding up to a
length bucket, and never recompiles at serving time (a step outside what was captured runs
eagerly). At capture the groups attend different lengths, so that none is taken for another
(dynamo gives equal sizes one symbol).

Inductor bakes the thread count into its C++ kernels (`#pragma omp parallel num_threads(2)`)
and dynamo guards on it, so a graph runs only at the thread count it was captured at. The
server changes its thread count when other processes take cores (cpu/governor.py): every
bucket is captured at each count of `thread_counts` (the governor's ladder: the cores, halved
down to 1), one torch.compile whose guard picks the graph of the step's count; a step at a
count with no graph for its bucket runs eagerly, never compiles.

Capture happens in `capture()`, during warmup, bucket by bucket from batch 1 up, at the first
thread count, then at the next, until `serving.warmup_max_seconds` is spent; each bucket's
capture time and its step time captured and eager (same inputs, same process) are the
warmup's figures. A bucket that cannot be
captured (no C++ compiler, an op that breaks the graph, the time bound) runs eagerly, and the
figures and the log say why. Inductor's compiled code is cached on disk under
`<cache_dir>/torch-<version>/<bundle id>`, so a restart of the same bundle loads it instead of
compiling again. CUDA graphs (torch.cuda.graph) are not captured yet: on CUDA the engine runs
eagerly and says so.

Greedy tokens are the same captured or not (tests/core/serving/test_step_graphs.py): the
fused kernels change the logits in the last bits only.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from aieng_core.model.decode_attention import MIN_GROUP_ROWS, group_sizes
from aieng_core.model.llama import LlamaForCausalLM
from aieng_core.serving.kv_cache import KVCachePool

log = logging.getLogger("aieng.serving.step_graphs")

EAGER, COMPILE, AUTO = "eager", "compile", "auto"
MIN_LENGTH = 2  # a decoding row attends at least its prompt's token and its first output
TIMED_STEPS = 10  # per bucket and path, after one untimed step
# Every engine of a process compiles the same decode_forward: room for all their buckets
# (dynamo's default of 8 graphs per function would silently fall back to eager).
RECOMPILE_LIMIT = 256


@dataclass(frozen=True)
class StepGraphSettings:
    """serving.step_graphs and serving.warmup_max_seconds, and where compiled code is cached."""

    mode: str = EAGER  # eager | compile | auto (compile on CPU when a C++ compiler is found)
    max_seconds: float = 120.0
    cache_dir: Path | None = None  # None: inductor's default (a temporary directory)
    # The thread counts steps may run at, most first (cpu/governor.py's ladder); empty: only the
    # count torch has when the graphs are made.
    thread_counts: tuple[int, ...] = ()


def batch_buckets(max_batch: int) -> list[int]:
    """1, 2, 4, ... below max_batch, then max_batch itself."""
    buckets, size = [], 1
    while size < max_batch:
        buckets.append(size)
        size *= 2
    return [*buckets, max_batch]


@dataclass
class BucketFigures:
    batch: int
    threads: int
    captured: bool = False
    capture_seconds: float | None = None
    eager_step_ms: float | None = None
    captured_step_ms: float | None = None
    reason: str | None = None  # why not captured

    def summary(self) -> dict[str, Any]:
        figures: dict[str, Any] = {"batch": self.batch, "threads": self.threads, "captured": self.captured}
        if self.captured:
            figures.update(
                capture_seconds=self.capture_seconds,
                eager_step_ms=self.eager_step_ms,
                captured_step_ms=self.captured_step_ms,
                speedup=(self.eager_step_ms or 0.0) / max(self.captured_step_ms or 0.0, 1e-9),
            )
        else:
            figures["reason"] = self.reason
        return figures


@dataclass
class StepGraphs:
    """The compiled decode step of each captured (thread count, bucket); `decode` runs a step
    in one, at the thread count the calling thread has."""

    model: LlamaForCausalLM
    pool: KVCachePool
    settings: StepGraphSettings
    bundle_key: str = "unbundled"  # the bundle id: the cache directory's last part
    compiled: Callable[..., torch.Tensor] | None = None  # one torch.compile: its guards pick the thread count's graph
    captured: set[tuple[int, int]] = field(default_factory=set)  # (threads, bucket)
    figures: list[BucketFigures] = field(default_factory=list)
    reason: str | None = None  # why nothing is captured, when nothing is
    capture_seconds: float = 0.0
    min_group_rows: int = MIN_GROUP_ROWS  # the attention groups' fewest rows (decode_attention.py)
    thread_counts: tuple[int, ...] = field(init=False)  # the settings', or torch's count when made

    def __post_init__(self) -> None:
        self.thread_counts = self.settings.thread_counts or (torch.get_num_threads(),)

    @property
    def buckets(self) -> list[int]:
        return batch_buckets(self.pool.max_batch)

    def bucket_for(self, rows: int) -> int:
        return next(size for size in self.buckets if size >= rows)

    def group_sizes(self, rows: int) -> tuple[int, ...]:
        """The attention groups of a decode step of `rows` rows, captured or not."""
        return group_sizes(rows, self.min_group_rows)

    def has(self, bucket: int) -> bool:
        """Whether `bucket` has a graph at the calling thread's torch thread count (running one
        without would compile it, mid-serving)."""
        return (torch.get_num_threads(), bucket) in self.captured

    def runnable(self, bucket: int, lengths: list[int]) -> bool:
        """Whether `bucket`'s graph runs groups attending `lengths` (one per group) now."""
        return self.has(bucket) and all(MIN_LENGTH <= length <= self.pool.max_context for length in lengths)

    def decode(
        self, bucket: int, ids: torch.Tensor, positions: torch.Tensor, biases: list[torch.Tensor]
    ) -> torch.Tensor:
        """The captured step of `bucket` (runnable) on inputs of exactly `bucket` rows. The graph
        was compiled with each group's length dynamic (capture marks them): any length fits."""
        assert self.compiled is not None
        return self.compiled(ids, positions, biases, self.pool.keys, self.pool.values)

    # ---- warmup ----------------------------------------------------------------------------
    def capture(self) -> dict[str, Any]:
        """Compile every (thread count, bucket) that fits in settings.max_seconds; the warmup's figures."""
        started = time.perf_counter()
        self.reason = unavailable(self.settings.mode, self.pool.keys[0].device)
        if self.reason is None:
            with inductor_cache(self._cache_dir()), torch.inference_mode():
                self._capture_buckets(started)
        else:
            self.figures = [BucketFigures(size, n, reason=self.reason) for n, size in self._plan()]
        self.capture_seconds = time.perf_counter() - started
        summary = self.summary()
        if self.reason is not None or not all(f.captured for f in self.figures):
            log.warning("decode step graphs: %s", summary["status"])
        else:
            log.info("decode step graphs: %s", summary["status"])
        return summary

    def _plan(self) -> list[tuple[int, int]]:
        """(threads, bucket) in capture order: every bucket at the first count, then at the next."""
        return [(threads, size) for threads in self.thread_counts for size in self.buckets]

    def _capture_buckets(self, started: float) -> None:
        from aieng_core.serving.device import torch_threads

        _allow_every_bucket()
        self.model._rotary_table(self.pool.keys[0])  # made once, eagerly: the graphs read it
        self.compiled = torch.compile(self.model.decode_forward, fullgraph=True, dynamic=False)
        plan = self._plan()
        for index, (threads, size) in enumerate(plan):
            figures = BucketFigures(size, threads)
            self.figures.append(figures)
            spent = time.perf_counter() - started
            if spent >= self.settings.max_seconds:
                figures.reason = (
                    f"not captured: warmup spent {spent:.0f} s of serving.warmup_max_seconds "
                    f"({self.settings.max_seconds:g})"
                )
                continue
            with torch_threads(threads):
                self._capture_one(figures)
            if figures.reason is not None and index == 0:
                # The first graph failed: the same failure would repeat for every other.
                self.reason = figures.reason
                self.figures += [BucketFigures(s, n, reason=figures.reason) for n, s in plan[1:]]
                return

    def _capture_one(self, figures: BucketFigures) -> None:
        """Compile and time one bucket at the calling thread's count (figures.reason says why not)."""
        assert self.compiled is not None
        size = figures.batch
        ids, positions, biases = self._idle_inputs(size)
        try:
            began = time.perf_counter()
            for bias in biases:
                torch._dynamo.mark_dynamic(bias, 2, min=MIN_LENGTH, max=self.pool.max_context)
            self.compiled(ids, positions, biases, self.pool.keys, self.pool.values)
            figures.capture_seconds = time.perf_counter() - began
        except Exception as exc:  # an op that breaks the graph, a compiler that fails
            figures.reason = f"not captured: {type(exc).__name__}: {first_line(exc)}"
            log.exception(
                "decode step graph for batch %d at %d threads failed to compile; it runs eagerly", size, figures.threads
            )
            return
        self.captured.add((figures.threads, size))
        figures.captured = True
        args = (ids, positions, biases, self.pool.keys, self.pool.values)
        figures.eager_step_ms = self._time(functools.partial(self.model.decode_forward, *args))
        figures.captured_step_ms = self._time(functools.partial(self.decode, size, ids, positions, biases))

    def _idle_inputs(self, size: int) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        """Inputs of `size` idle rows (the scratch position, each row seeing position 0 only):
        capturing and timing them never touches a live sequence's keys. Group g attends
        MIN_LENGTH + g positions: lengths that differ, so each stays its own dynamic size."""
        device = self.pool.keys[0].device
        ids = torch.full((size,), int(self.model.config.pad_token_id or 0), dtype=torch.long, device=device)
        positions = torch.full((size,), self.pool.scratch_position, dtype=torch.long, device=device)
        biases = []
        for group, rows in enumerate(self.group_sizes(size)):
            length = min(MIN_LENGTH + group, self.pool.max_context)
            biases.append(self.model.decode_bias(torch.ones(rows, dtype=torch.long, device=device), length))
        return ids, positions, biases

    @staticmethod
    def _time(step: Callable[[], Any]) -> float:
        step()
        began = time.perf_counter()
        for _ in range(TIMED_STEPS):
            step()
        return (time.perf_counter() - began) * 1000.0 / TIMED_STEPS

    def _cache_dir(self) -> Path | None:
        if self.settings.cache_dir is None:
            return None
        return self.settings.cache_dir / f"torch-{torch.__version__}" / self.bundle_key

    def summary(self) -> dict[str, Any]:
        counts = self.thread_counts
        by_threads = {n: [f.batch for f in self.figures if f.captured and f.threads == n] for n in counts}
        captured = by_threads[counts[0]]
        cache_dir = self._cache_dir()
        if self.reason is not None:
            status = self.reason
        elif all(f.captured for f in self.figures):
            at = "" if len(counts) == 1 else " at " + " and ".join(map(str, counts)) + " threads"
            status = f"captured: batch buckets {captured}{at} (torch.compile, inductor)"
        elif len(counts) == 1:
            status = f"captured batch buckets {captured} of {self.buckets}; the others run eagerly"
        else:
            each = ", ".join(f"{by_threads[n]} at {n} thread{'s' if n != 1 else ''}" for n in counts)
            status = f"captured batch buckets {each} of {self.buckets}; the others run eagerly"
        return {
            "mode": self.settings.mode,
            "status": status,
            "captured_buckets": captured,  # at the first (largest) thread count
            "thread_counts": list(counts),
            "captured_by_threads": {str(n): buckets for n, buckets in by_threads.items()},
            "capture_seconds": self.capture_seconds,
            "warmup_max_seconds": self.settings.max_seconds,
            "cache_dir": str(cache_dir) if cache_dir else None,
            "buckets": [f.summary() for f in self.figures],
        }


def unavailable(mode: str, device: torch.device) -> str | None:
    """Why no step can be captured in `mode` on `device`, or None when capture is worth trying."""
    if mode == EAGER:
        return "not captured: serving.step_graphs is eager"
    if device.type == "cuda":
        return "not captured: CUDA graph capture is not implemented yet; every decode step runs eagerly"
    if device.type != "cpu":
        return f"not captured: no step graphs on {device.type}"
    from torch._inductor import config as inductor_config

    # The compilers inductor would try ($CXX or g++ when torch was imported; None: conda's).
    compilers = [name for name in inductor_config.cpp.cxx if name]
    if not any(shutil.which(name) for name in compilers):
        named = ", ".join(repr(name) for name in compilers)
        return f"not captured: no C++ compiler ({named} not found on PATH) for inductor; steps run eagerly"
    return None


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else "(no message)"


def _allow_every_bucket() -> None:
    config = torch._dynamo.config
    config.recompile_limit = max(config.recompile_limit, RECOMPILE_LIMIT)
    config.accumulated_recompile_limit = max(config.accumulated_recompile_limit, RECOMPILE_LIMIT)


@contextlib.contextmanager
def inductor_cache(directory: Path | None) -> Iterator[None]:
    """Inductor's on-disk cache (TORCHINDUCTOR_CACHE_DIR) at `directory` while it compiles."""
    if directory is None:
        yield
        return
    directory.mkdir(parents=True, exist_ok=True)
    before = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(directory)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = before
