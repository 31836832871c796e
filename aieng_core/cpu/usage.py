"""How much CPU other processes took on this process's CPUs, between two samples.

`/proc/stat` counts, per CPU, the time spent busy (user, nice, system, irq, softirq) and the
time the hypervisor gave the vCPU to someone else (steal). Summed over the CPUs this process
may run on, less the CPU time of the processes counted as ours, what is left is what others
took: `others_cores` (1.0: a whole core, a `while True: pass` beside us). Ours is read from
each process's `/proc/<pid>/stat` (utime + stime, every thread): the server alone, or the
gate with the servers it started.

Ticks are 1/USER_HZ s (10 ms), so a window of a quarter second measures to about 0.05 of a
core per CPU; a sample over a shorter window is not taken.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

TICK_SECONDS = 1.0 / os.sysconf("SC_CLK_TCK")
# /proc/stat cpuN columns: user nice system idle iowait irq softirq steal guest guest_nice.
# guest time is already inside user (and guest_nice inside nice): not added twice.
BUSY_COLUMNS = (0, 1, 2, 5, 6, 7)
MIN_WINDOW_S = 0.05


@dataclass(frozen=True)
class CpuUse:
    """One window: seconds of wall time, and the cores others and we used on average in it."""

    seconds: float
    others_cores: float
    ours_cores: float


class CpuSampler:
    """`sample()` returns the CPU use since the previous sample (None for a first one, or a window
    under MIN_WINDOW_S). `cpus`: the CPUs to count (this process's affinity); `ours`: the pids
    counted as ours (called at every sample, so children started later count too)."""

    def __init__(
        self,
        cpus: Iterable[int],
        ours: Callable[[], Iterable[int]] = lambda: [os.getpid()],
        proc: Path = Path("/proc"),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cpus = frozenset(cpus)
        self.ours = ours
        self.proc = proc
        self.clock = clock
        self._last: tuple[float, float, dict[int, float]] | None = None

    def sample(self) -> CpuUse | None:
        now = self.clock()
        busy = self._busy_seconds()
        own = {pid: seconds for pid in self.ours() if (seconds := self._process_seconds(pid)) is not None}
        last, self._last = self._last, (now, busy, own)
        if last is None:
            return None
        then, busy_then, own_then = last
        window = now - then
        if window < MIN_WINDOW_S:
            self._last = last  # keep counting from the earlier sample
            return None
        # A process that started in the window counts from zero; one that ended is not counted.
        ours = sum(seconds - own_then.get(pid, 0.0) for pid, seconds in own.items())
        others = max(0.0, (busy - busy_then) - ours)
        return CpuUse(seconds=window, others_cores=others / window, ours_cores=max(0.0, ours) / window)

    def _busy_seconds(self) -> float:
        ticks = 0
        for line in (self.proc / "stat").read_text(encoding="ascii").splitlines():
            name, _, rest = line.partition(" ")
            if not name.startswith("cpu") or name == "cpu":
                continue
            if int(name[3:]) in self.cpus:
                columns = rest.split()
                ticks += sum(int(columns[i]) for i in BUSY_COLUMNS if i < len(columns))
        return ticks * TICK_SECONDS

    def _process_seconds(self, pid: int) -> float | None:
        try:
            text = (self.proc / str(pid) / "stat").read_text(encoding="ascii", errors="replace")
        except OSError:  # gone
            return None
        # "pid (comm) state ..." where comm may hold spaces and parentheses: fields after the last ')'.
        fields = text[text.rindex(")") + 2 :].split()
        return (int(fields[11]) + int(fields[12])) * TICK_SECONDS  # utime, stime (fields 14, 15)
