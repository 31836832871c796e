"""How many threads the engine's next steps run with: the cores the process has, less what
other processes take of them.

A decode step of a small model is hundreds of short OpenMP parallel regions, each ending at a
barrier where every thread of the team waits for the last. Beside a process that holds a core
(`while True: pass`), a team as large as the machine always has a thread waiting for the
kernel to schedule it: each region then costs a scheduler time slice, and the server made 59
tokens/s where it made 6,911 alone (issue 39). Sleeping at the barriers instead
(OMP_WAIT_POLICY=PASSIVE) removes the collapse but halves the rate on a quiet machine, where
waking a sleeping vCPU is slow. Fewer threads do neither: one thread beside the busy process
runs on the core it leaves free, with no barrier to wait at.

So the engine loop asks `threads()` before each step. Every `interval_s` it samples the CPU
other processes took on this process's CPUs (usage.py) and picks, from the thread counts the
engine has step graphs for (`ladder`: the cores, halved down to 1), the largest that fits in
the cores left free, rounded to the nearest core (a load generator's bursts, a tenth of a core,
leave 2 of 2; a busy process's whole core leaves 1). It steps down at once (every step at too
many threads is slow) and up only once `up_after_s` of samples in a row leave room (a
neighbour that pauses for a moment must not make it flap).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from aieng_core.cpu.usage import CpuSampler, CpuUse

log = logging.getLogger("aieng.cpu")

INTERVAL_S = 0.25
UP_AFTER_S = 1.0


def thread_ladder(cores: int) -> tuple[int, ...]:
    """The thread counts the engine keeps step graphs for: the cores, then halved down to 1
    (2 -> (2, 1); 8 -> (8, 4, 2, 1); 6 -> (6, 3, 1))."""
    if cores < 1:
        raise ValueError(f"cores must be at least 1, not {cores}")
    ladder = [cores]
    while ladder[-1] > 1:
        ladder.append(max(1, ladder[-1] // 2))
    return tuple(ladder)


def fitting(ladder: tuple[int, ...], free_cores: float) -> int:
    """The largest count of the ladder within the free cores rounded to the nearest; at least the smallest."""
    return next((count for count in ladder if count <= free_cores + 0.5), ladder[-1])


@dataclass(frozen=True)
class ThreadsNow:
    """The governor's state, for /metrics and the logs."""

    threads: int
    others_cores: float  # other processes' CPU in the last window, on this process's CPUs
    switches: int  # changes of thread count since start


class ThreadGovernor:
    """Thread-safe: every engine loop of a server may ask it (one sampler, one decision)."""

    def __init__(
        self,
        ladder: tuple[int, ...],
        sampler: CpuSampler | None,
        interval_s: float = INTERVAL_S,
        up_after_s: float = UP_AFTER_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`sampler` None: fixed at the ladder's top (serving.adapt_threads off)."""
        self.ladder = ladder
        self.sampler = sampler
        self.interval_s = interval_s
        self.up_after_s = up_after_s
        self.clock = clock
        self._lock = threading.Lock()
        self._threads = ladder[0]
        self._others = 0.0
        self._switches = 0
        self._next_sample = clock()
        self._room_since: float | None = None  # since when every sample left room for more
        if sampler is not None:
            sampler.sample()  # the first window starts now

    @property
    def adapts(self) -> bool:
        return self.sampler is not None and len(self.ladder) > 1

    def threads(self) -> int:
        """The thread count for the next step (cheap between samples: a clock read)."""
        if not self.adapts or self.clock() < self._next_sample:
            return self._threads
        with self._lock:
            now = self.clock()
            if now >= self._next_sample:
                self._next_sample = now + self.interval_s
                assert self.sampler is not None
                use = self.sampler.sample()
                if use is not None:
                    self._decide(use, now)
            return self._threads

    def settle(self) -> int:
        """Measure one window now (sleeping through it) and take its count at once, up or down:
        a server about to turn ready starts at the count the machine has room for, not at the one
        the window before it (a warmup compiling in child processes) suggested."""
        if not self.adapts:
            return self._threads
        assert self.sampler is not None
        self.sampler.sample()
        time.sleep(self.interval_s)
        use = self.sampler.sample()
        with self._lock:
            if use is not None:
                self._others = use.others_cores
                target = fitting(self.ladder, self.ladder[0] - use.others_cores)
                if target != self._threads:
                    self._set(target)
            self._next_sample = self.clock() + self.interval_s
            self._room_since = None
            return self._threads

    def now(self) -> ThreadsNow:
        return ThreadsNow(self._threads, self._others, self._switches)

    def _decide(self, use: CpuUse, now: float) -> None:
        self._others = use.others_cores
        target = fitting(self.ladder, self.ladder[0] - use.others_cores)
        if target < self._threads:
            self._set(target)
            self._room_since = None
        elif target > self._threads:
            self._room_since = self._room_since if self._room_since is not None else now - use.seconds
            if now - self._room_since >= self.up_after_s:
                self._set(target)
                self._room_since = None
        else:
            self._room_since = None

    def _set(self, threads: int) -> None:
        log.info(
            "engine threads: %d (other processes took %.2f of %d cores)",
            threads,
            self._others,
            self.ladder[0],
            extra={"threads": threads, "others_cores": round(self._others, 3)},
        )
        self._threads = threads
        self._switches += 1
