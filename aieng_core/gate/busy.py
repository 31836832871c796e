"""Was the machine too busy for the stress step's SLOs to say anything of the bundle?

The stress step's SLOs are absolute: P99 latencies, goodput and a time bound per level. Beside
a process that holds a core of two, they measure that process as much as the bundle: with other
processes running, the gate failed a good bundle three times in a row at stress
(`concurrency=8.good_fraction = 0.7812 (limit 0.9)`, then `concurrency=1.unfinished` twice;
issue 39). The server now adapts its threads to what others leave it (cpu/governor.py), so a
bundle beside one busy process mostly meets its SLOs; when it does not, the gate must not blame
the bundle for the machine.

So every stress level records `others_cores`: the CPU other processes took on this process's
CPUs during it (cpu/usage.py), the gate's own process and the server it loads (with its
children) counted as ours. `judge` decides:

- a level that met every SLO passed, whatever the load;
- a level that broke an SLO while the machine was quiet fails the gate;
- when every level that broke an SLO did so while others took at least `gate.busy_cores_limit`
  of the cores this process may use, the outcome is inconclusive: no refusal, production
  unchanged, and a re-run can pass.

Only figures a busy machine explains are excused: latencies, goodput and requests the time
bound cut (LOAD_FIGURES). A failed request, or a server that does not drain and exit 0, is a
failure whatever the load: a busy machine makes a server slow, not wrong. A level whose load
was not measured (shorter than cpu/usage.py's shortest window) counts as quiet: the machine is
blamed only on evidence.

The compare step has no such rule: it serves both bundles in pairs, back to back, so a load
hits both members of a pair alike, and its error rates were measured beside a busy process
(docs/deployment/promotion-gate.md); it records `others_cores` per round all the same.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import psutil

from aieng_core.cpu.quota import read_cpu_quota
from aieng_core.cpu.usage import CpuSampler
from aieng_core.gate.report import Outcome

# The SLO figures (slo_violations' names, less the level's) a busy machine can explain.
LOAD_FIGURES = frozenset({"ttft_ms.p99", "e2el_ms.p99", "good_fraction", "unfinished", "completed"})


@dataclass(frozen=True)
class CpuShare:
    """The CPUs others' time is counted on (this process's affinity) and the cores this process
    may use at once (its quota, cpu/quota.py)."""

    cpus: int
    cores: int

    def taken(self, others_cores: float) -> float:
        """The cores others took out of those this process could have used. With a quota smaller
        than the affinity (a 2-core pod on a 64-CPU node), the CPUs beyond the quota are others'
        to use: their neighbours' load takes nothing from us until it reaches into our share."""
        return max(0.0, others_cores - (self.cpus - self.cores))


@dataclass(frozen=True)
class LevelLoad:
    """One stress level as the rule sees it."""

    name: str  # "concurrency=8"
    broken: tuple[str, ...]  # the figures of the SLOs it broke ("good_fraction", ...); empty: it passed
    others_cores: float | None  # other processes' CPU on our CPUs during the level; None: not measured


def was_busy(level: LevelLoad, share: CpuShare, limit: float) -> bool:
    """Did others take at least `limit` of our cores during the level (measured)?"""
    return level.others_cores is not None and share.taken(level.others_cores) >= limit


def excused(level: LevelLoad, share: CpuShare, limit: float) -> bool:
    """A broken level the machine, not the bundle, may answer for: busy, and only load figures broken."""
    return bool(level.broken) and was_busy(level, share, limit) and set(level.broken) <= LOAD_FIGURES


def judge(levels: Sequence[LevelLoad], share: CpuShare, limit: float) -> Outcome:
    """passed: no level broke an SLO. inconclusive: every level that broke one is excused (the
    machine was busy then). failed: one broke an SLO while the machine was quiet (or broke one
    no load explains)."""
    broken = [level for level in levels if level.broken]
    if not broken:
        return "passed"
    return "inconclusive" if all(excused(level, share, limit) for level in broken) else "failed"


def cpu_share() -> CpuShare:
    quota = read_cpu_quota()
    return CpuShare(cpus=len(quota.affinity), cores=quota.cores)


def our_pids(servers: Iterable[int]) -> list[int]:
    """This process and the servers it started, with their children (a server's compile
    workers): the CPU they take is the gate's own, not a neighbour's. This process's other
    children are not ours: a load generator's helper processes are none, and the error-rate
    script's CPU hogs must count as the neighbours they stand for."""
    pids = [os.getpid()]
    for pid in servers:
        try:
            pids += [pid, *(child.pid for child in psutil.Process(pid).children(recursive=True))]
        except psutil.Error:  # gone
            continue
    return pids


def gate_sampler(servers: Callable[[], Iterable[int]]) -> CpuSampler:
    """A CpuSampler over this process's CPUs, with ours = this process and `servers()` (asked at
    every sample, children included)."""
    return CpuSampler(read_cpu_quota().affinity, ours=lambda: our_pids(servers()))
