"""The busy-machine rule of the stress step (gate/busy.py) and how a gate records its outcome
(gate/report.py): pure functions and real processes, no gate run (test_inconclusive.py runs one)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import psutil
import pytest

from aieng_core.gate.busy import CpuShare, LevelLoad, excused, judge, our_pids
from aieng_core.gate.report import GateFailed, GateInconclusive, GateReport, Outcome

TWO_CORES = CpuShare(cpus=2, cores=2)
LIMIT = 0.5


def level(name: str, *broken: str, others: float | None = 0.0) -> LevelLoad:
    return LevelLoad(name, broken, others)


@pytest.mark.parametrize(
    ("levels", "expected"),
    [
        # Every SLO met: passed, however busy the machine was.
        ([level("concurrency=1", others=1.9), level("concurrency=8", others=0.0)], "passed"),
        # An SLO broken on a quiet machine: the bundle's doing.
        ([level("concurrency=1"), level("concurrency=8", "good_fraction", others=0.1)], "failed"),
        # Issue 39's three failures, each with a busy process beside the gate: undecided.
        ([level("concurrency=1"), level("concurrency=8", "good_fraction", others=1.02)], "inconclusive"),
        ([level("concurrency=1", "unfinished", "completed", others=0.97), level("poisson=4")], "inconclusive"),
        # At the limit is busy; just under it is not.
        ([level("concurrency=8", "ttft_ms.p99", "e2el_ms.p99", others=0.5)], "inconclusive"),
        ([level("concurrency=8", "ttft_ms.p99", others=0.49)], "failed"),
        # One level broke on a quiet machine: the busy one beside it excuses nothing.
        ([level("concurrency=1", "ttft_ms.p99", others=1.0), level("concurrency=8", "ttft_ms.p99")], "failed"),
        # A failed request is no load's doing: a busy machine makes a server slow, not wrong.
        ([level("concurrency=8", "errors", "good_fraction", others=1.5)], "failed"),
        # Not measured (a level shorter than a sampling window): the machine is not blamed.
        ([level("concurrency=8", "good_fraction", others=None)], "failed"),
        # The server's drain (stress.py adds it as a level no load excuses).
        ([level("concurrency=8", others=1.5), level("server", "exit_code", others=None)], "failed"),
    ],
)
def test_the_rule(levels: list[LevelLoad], expected: Outcome) -> None:
    assert judge(levels, TWO_CORES, LIMIT) == expected


def test_a_zero_limit_excuses_every_measured_load_break_and_a_huge_one_none() -> None:
    broken = [level("concurrency=1", "ttft_ms.p99", others=0.0)]
    assert judge(broken, TWO_CORES, 0.0) == "inconclusive"
    assert judge([level("concurrency=1", "ttft_ms.p99", others=1.9)], TWO_CORES, 1000.0) == "failed"
    assert not excused(level("concurrency=1", others=1.9), TWO_CORES, 0.0)  # nothing broken, nothing to excuse


def test_cpus_beyond_the_quota_are_the_neighbours_to_use() -> None:
    """A 2-core quota on a 64-CPU node: 40 busy CPUs elsewhere take nothing of ours; 63.5 take 1.5."""
    pod = CpuShare(cpus=64, cores=2)
    assert pod.taken(40.0) == 0.0 and pod.taken(63.5) == 1.5
    assert judge([level("concurrency=8", "good_fraction", others=40.0)], pod, LIMIT) == "failed"
    assert judge([level("concurrency=8", "good_fraction", others=63.5)], pod, LIMIT) == "inconclusive"
    assert TWO_CORES.taken(1.02) == 1.02


@pytest.fixture
def server_with_child() -> Iterator[subprocess.Popen[bytes]]:
    """A process standing for `aieng serve`, with a child of its own (a compile worker)."""
    script = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
    script += "print('ready', flush=True); time.sleep(60)"
    server = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    assert server.stdout is not None and server.stdout.readline() == b"ready\n"
    try:
        yield server
    finally:
        if server.poll() is None:
            for child in psutil.Process(server.pid).children(recursive=True):
                child.kill()
            server.kill()
            server.wait()


def test_ours_is_this_process_and_the_servers_with_their_children(server_with_child: subprocess.Popen[bytes]) -> None:
    (worker,) = psutil.Process(server_with_child.pid).children()
    neighbour = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # a CPU hog of the script's
    try:
        assert our_pids([server_with_child.pid]) == [os.getpid(), server_with_child.pid, worker.pid]
        assert neighbour.pid not in our_pids([server_with_child.pid])
    finally:
        neighbour.kill()
        neighbour.wait()
    gone = server_with_child.pid
    worker.kill()
    server_with_child.kill()
    server_with_child.wait()
    assert our_pids([gone]) == [os.getpid()]  # a server that ended is no one's


def report() -> GateReport:
    return GateReport("b" * 16, "/bundle", "run-1", "tester", "2026-01-01T00:00:00.000+00:00", {"bundle_id": None})


BUSY = (
    "the machine was busy (other processes took 1.02 of 2 cores during concurrency=8; there "
    "concurrency=8.good_fraction = 0.7812, limit 0.9): the stress step's SLOs say nothing of the bundle then"
)


def test_the_report_records_the_outcome_in_one_field() -> None:
    undecided = GateInconclusive("stress", "concurrency=8.good_fraction", BUSY, 0.78125, 0.9)
    assert isinstance(undecided, GateFailed)  # every `except GateFailed` leaves production unchanged
    assert str(undecided) == f"inconclusive: {BUSY}"
    refused = GateFailed("stress", "concurrency=8.good_fraction", "too few good requests", 0.78125, 0.9)
    assert (
        str(refused) == "gate failed at stress: concurrency=8.good_fraction = 0.7812 (limit 0.9): too few good requests"
    )
    running = report()
    assert (running.as_dict()["outcome"], running.passed) == (None, False)
    for failure, outcome in ((undecided, "inconclusive"), (refused, "failed"), (None, "passed")):
        made = report()
        made.conclude(failure)
        written = made.as_dict()
        assert (written["outcome"], written["passed"]) == (outcome, outcome == "passed")
        assert written["finished_at"] is not None
        if failure is None:
            assert written["failure"] is None
        else:
            assert written["failure"]["outcome"] == outcome and written["failure"]["message"] == str(failure)
