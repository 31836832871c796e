"""The CPU the process has (cpu/quota.py), what other processes take of it (cpu/usage.py) and
the thread count the engine steps at (cpu/governor.py): cgroup files, /proc and the clock are
files and functions the tests give, so every case runs on any machine; one test reads this
machine's own /proc beside a real busy process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from aieng_core.cpu.governor import ThreadGovernor, fitting, thread_ladder
from aieng_core.cpu.quota import CpuQuota, cpu_list, parse_cpu_list, read_cpu_quota
from aieng_core.cpu.usage import CpuSampler, CpuUse

V2_MOUNT = "30 23 0:27 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw"
V1_MOUNT = "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct"


def proc_tree(tmp_path: Path, cgroup: str, mountinfo: str, cpus: str = "0-7") -> Path:
    proc = tmp_path / "proc" / "self"
    proc.mkdir(parents=True)
    (proc / "cgroup").write_text(cgroup)
    (proc / "mountinfo").write_text(mountinfo + "\n")
    (proc / "status").write_text(f"Name:\tpython\nCpus_allowed_list:\t{cpus}\n")
    return tmp_path


def write(path: Path, text: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    for name, content in (line.split("=", 1) for line in text.split(";")):
        (path / name).write_text(content + "\n")


# ---- quota ------------------------------------------------------------------------------------
def test_cgroup_v2_cpu_max_is_the_smallest_limit_on_the_path(tmp_path) -> None:
    root = proc_tree(tmp_path, "0::/kubepods/pod1/ctr\n", V2_MOUNT)
    base = root / "sys/fs/cgroup"
    write(base / "kubepods", "cpu.max=max 100000")
    write(base / "kubepods/pod1", "cpu.max=250000 100000")  # the pod: 2.5 CPUs
    write(base / "kubepods/pod1/ctr", "cpu.max=300000 100000")  # the container asks for more: the pod's holds
    quota = read_cpu_quota(root)
    assert quota.affinity == tuple(range(8))
    assert quota.quota_cores == 2.5 and quota.quota_source == str(base / "kubepods/pod1/cpu.max")
    assert quota.cores == 2  # rounded down: a team is as fast as its slowest thread
    assert quota.describe() == f"2 cores (affinity 0-7; cgroup CPU limit 2.5 CPUs ({base / 'kubepods/pod1/cpu.max'}))"


def test_cgroup_v1_cfs_quota_and_the_affinity_mask_whichever_is_smaller(tmp_path) -> None:
    root = proc_tree(tmp_path, "4:memory:/x\n3:cpu,cpuacct:/docker/abc\n0::/\n", V1_MOUNT, cpus="0-1")
    base = root / "sys/fs/cgroup/cpu,cpuacct"
    write(base / "docker/abc", "cpu.cfs_quota_us=400000;cpu.cfs_period_us=100000")
    write(base / "docker", "cpu.cfs_quota_us=-1;cpu.cfs_period_us=100000")
    quota = read_cpu_quota(root)
    assert quota.quota_cores == 4.0 and quota.affinity == (0, 1)
    assert quota.cores == 2  # taskset to two CPUs: the mask is the limit


def test_a_cgroup_namespace_sees_its_own_cgroup_as_the_mount_root(tmp_path) -> None:
    root = proc_tree(tmp_path, "0::/\n", V2_MOUNT)
    write(root / "sys/fs/cgroup", "cpu.max=50000 100000")
    assert read_cpu_quota(root).quota_cores == 0.5
    assert read_cpu_quota(root).cores == 1  # never fewer than one


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ("cpu.max=max 100000", None),  # no limit
        ("cpu.max=garbage", None),  # unreadable: not a limit to plan for
        ("cpu.max=0 100000", None),
        ("other=1", None),  # no cpu controller file at all
    ],
)
def test_no_limit_or_an_unreadable_one_is_none(tmp_path, files, expected) -> None:
    root = proc_tree(tmp_path, "0::/a\n", V2_MOUNT)
    write(root / "sys/fs/cgroup/a", files)
    assert read_cpu_quota(root).quota_cores == expected


def test_no_cgroup_filesystem_means_the_affinity_mask(tmp_path) -> None:
    root = proc_tree(tmp_path, "0::/a\n", "1 0 8:1 / / rw - ext4 /dev/sda1 rw", cpus="0,2,4-5")
    quota = read_cpu_quota(root)
    assert (quota.quota_cores, quota.cores, cpu_list(quota.affinity)) == (None, 4, "0,2,4-5")
    assert parse_cpu_list("0,2,4-5\n") == (0, 2, 4, 5)


def test_this_process_quota_counts_its_affinity_mask() -> None:
    quota = read_cpu_quota()
    assert quota.affinity == tuple(sorted(os.sched_getaffinity(0)))
    assert 1 <= quota.cores <= len(quota.affinity)


# ---- usage ------------------------------------------------------------------------------------
class FakeProc:
    """A /proc with two CPUs' busy ticks and one process's utime/stime, advanced by the test."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.ticks = {0: 0, 1: 0, 2: 0}
        self.own = 0
        self.write()

    def write(self) -> None:
        lines = ["cpu  1 2 3 4 5 6 7 8 0 0"]
        # user nice system idle iowait irq softirq steal guest guest_nice: busy split over four
        # busy columns, idle and iowait left out, guest (inside user already) never added.
        for cpu, ticks in self.ticks.items():
            user, system, softirq = ticks // 2, ticks // 4, ticks // 8
            steal = ticks - user - system - softirq
            lines.append(f"cpu{cpu} {user} 0 {system} 999 999 0 {softirq} {steal} 77 0")
        (self.root / "stat").write_text("\n".join(lines) + "\n")
        stat = self.root / "4242"
        stat.mkdir(exist_ok=True)
        fields = ["S"] + ["0"] * 10 + [str(self.own // 2), str(self.own - self.own // 2)] + ["0"] * 30
        (stat / "stat").write_text(f"4242 (py (thon) x) {' '.join(fields)}\n")


def test_others_are_the_busy_ticks_of_our_cpus_less_our_own(tmp_path) -> None:
    proc = FakeProc(tmp_path)
    now = [100.0]
    sampler = CpuSampler([0, 1], ours=lambda: [4242], proc=tmp_path, clock=lambda: now[0])
    assert sampler.sample() is None  # the first sample opens the window
    now[0] += 1.0
    proc.ticks = {0: 100, 1: 60, 2: 500}  # 1.6 CPU-seconds on our CPUs; CPU 2 is not ours
    proc.own = 90  # of which we took 0.9
    proc.write()
    use = sampler.sample()
    assert use == CpuUse(seconds=1.0, others_cores=pytest.approx(0.7), ours_cores=pytest.approx(0.9))


def test_a_window_too_short_to_measure_keeps_counting_from_the_earlier_sample(tmp_path) -> None:
    proc = FakeProc(tmp_path)
    now = [0.0]
    sampler = CpuSampler([0, 1], ours=lambda: [4242], proc=tmp_path, clock=lambda: now[0])
    sampler.sample()
    now[0] = 0.01
    assert sampler.sample() is None
    now[0] = 0.5
    proc.ticks = {0: 50, 1: 0, 2: 0}
    proc.write()
    use = sampler.sample()
    assert use is not None and use.seconds == 0.5 and use.others_cores == pytest.approx(1.0)


def test_a_process_that_ended_is_not_counted(tmp_path) -> None:
    FakeProc(tmp_path)
    sampler = CpuSampler([0], ours=lambda: [4242, 999_999], proc=tmp_path, clock=iter([0.0, 1.0]).__next__)
    sampler.sample()
    assert sampler.sample() == CpuUse(1.0, 0.0, 0.0)


def test_a_real_busy_process_is_counted_as_others_and_we_are_not() -> None:
    import time

    import psutil

    sampler = CpuSampler(os.sched_getaffinity(0))
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        spinner = psutil.Process(busy.pid)
        before = sum(spinner.cpu_times()[:2])
        sampler.sample()
        time.sleep(0.5)  # the window measured: this process sleeps through it
        use = sampler.sample()
        took = sum(spinner.cpu_times()[:2]) - before
    finally:
        busy.kill()
        busy.wait()
    assert use is not None
    # Whatever else the machine runs, the busy process's own CPU time is inside what others took
    # (less a tick of rounding on each CPU), and this sleeping process took almost none.
    tick = 0.01 * len(os.sched_getaffinity(0)) / use.seconds
    assert use.others_cores >= took / use.seconds - 2 * tick and took / use.seconds > 0.3
    assert use.ours_cores < 0.1


# ---- governor ---------------------------------------------------------------------------------
def test_the_ladder_halves_down_to_one() -> None:
    assert thread_ladder(1) == (1,)
    assert thread_ladder(2) == (2, 1)
    assert thread_ladder(6) == (6, 3, 1)
    assert thread_ladder(8) == (8, 4, 2, 1)
    with pytest.raises(ValueError, match="at least 1"):
        thread_ladder(0)


@pytest.mark.parametrize(
    ("free", "expected"),
    [(2.0, 2), (1.6, 2), (1.4, 1), (1.0, 1), (0.0, 1), (-1.0, 1)],
)
def test_the_count_that_fits_is_the_free_cores_rounded(free, expected) -> None:
    assert fitting((2, 1), free) == expected


class ScriptedSampler:
    """Hands out the others' cores the test scripts, one per sample."""

    def __init__(self, others: list[float]) -> None:
        self.others = others
        self.taken = 0

    def sample(self) -> CpuUse | None:
        if self.taken == 0:
            self.taken = 1
            return None
        value = self.others[min(self.taken - 1, len(self.others) - 1)]
        self.taken += 1
        return CpuUse(0.25, value, 1.0)


def test_down_at_once_up_only_after_a_second_of_room() -> None:
    now = [0.0]
    # A busy neighbour arrives, pauses for one window, stays, then leaves for good.
    sampler = ScriptedSampler([0.1, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    governor = ThreadGovernor((2, 1), sampler, clock=lambda: now[0])  # type: ignore[arg-type]
    seen = []
    for _ in range(10):
        now[0] += 0.25
        seen.append(governor.threads())
        assert governor.threads() == seen[-1]  # between samples: no new sample, the same answer
    assert seen == [2, 1, 1, 1, 1, 1, 1, 1, 2, 2]
    assert governor.now().switches == 2 and governor.now().others_cores == 0.0


def test_without_a_sampler_the_count_is_fixed() -> None:
    governor = ThreadGovernor((2, 1), None)
    assert not governor.adapts and governor.threads() == 2 and governor.settle() == 2
    assert not ThreadGovernor((1,), ScriptedSampler([5.0])).adapts  # type: ignore[arg-type]


def test_settle_takes_a_fresh_window_at_once_both_ways() -> None:
    governor = ThreadGovernor((4, 2, 1), ScriptedSampler([2.2]), interval_s=0.01)  # type: ignore[arg-type]
    assert governor.settle() == 2  # 4 - 2.2 = 1.8 free: 2 threads
    quiet = ThreadGovernor((4, 2, 1), ScriptedSampler([0.0]), interval_s=0.01)  # type: ignore[arg-type]
    quiet._threads = 1
    assert quiet.settle() == 4  # up at once too: nothing is serving yet


def test_the_quota_caps_what_the_ladder_starts_from() -> None:
    assert CpuQuota(affinity=(0, 1, 2, 3), quota_cores=1.5, quota_source="f").cores == 1
    assert CpuQuota(affinity=(0, 1, 2, 3), quota_cores=None, quota_source=None).cores == 4
