"""The CPU this process really has: its affinity mask and its cgroup's CPU bandwidth limit.

`os.cpu_count()` (and torch's default thread count) is the host's count. A Kubernetes pod
with `limits.cpu: 2` on a 64-core node, a `taskset` or a `docker --cpus` sees every core and
may use only some: OpenMP threads beyond what the process may run at once wait at every
barrier for a thread the kernel has descheduled (or throttled: a cgroup over its quota is
stopped until the next period). So the threads the engine, training and the data path run
with come from here:

- the affinity mask (`sched_getaffinity`; a cpuset cgroup shows up in it);
- the CPU bandwidth limit of the cgroup and of every ancestor up to the mount's root, the
  smallest: cgroup v2 `cpu.max` (`"max 100000"` is no limit) or cgroup v1
  `cpu.cfs_quota_us` / `cpu.cfs_period_us` (`-1` is no limit).

`cores` is the smaller of the two, rounded down, at least 1: a team of OpenMP threads is only
as fast as its slowest thread, so 1.5 CPUs of quota run 1 thread, not 2 (automaxprocs and
Go's runtime make the same choice). Everything is read from files under `root`, so the tests
give it a tree of their own.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class CpuQuota:
    """What `read_cpu_quota` found."""

    affinity: tuple[int, ...]  # the CPUs this process may run on
    quota_cores: float | None  # the cgroup's CPU bandwidth limit in CPUs; None: no limit
    quota_source: str | None  # the file that limit came from

    @property
    def cores(self) -> int:
        """The threads this process can run at once: the affinity mask's size, or the quota rounded
        down when that is smaller; at least 1."""
        limit = len(self.affinity) if self.quota_cores is None else min(len(self.affinity), self.quota_cores)
        return max(1, math.floor(limit + 1e-9))

    def describe(self) -> str:
        """One line: `2 cores (affinity 0-1; no cgroup CPU limit)`."""
        quota = (
            "no cgroup CPU limit"
            if self.quota_cores is None
            else f"cgroup CPU limit {self.quota_cores:g} CPUs ({self.quota_source})"
        )
        return f"{self.cores} core{'s' if self.cores != 1 else ''} (affinity {cpu_list(self.affinity)}; {quota})"


def read_cpu_quota(root: Path = Path("/"), pid: str = "self") -> CpuQuota:
    """This process's affinity mask (or, with a `root` other than /, the one in
    `root/proc/<pid>/status`) and its cgroup's CPU limit."""
    if root == Path("/"):
        affinity = tuple(sorted(os.sched_getaffinity(0)))
    else:
        affinity = _affinity_from_status(root / "proc" / pid / "status")
    found = _cgroup_limit(root, pid)
    return CpuQuota(affinity, *(found or (None, None)))


def usable_cores() -> int:
    """The threads this process can run at once (CpuQuota.cores): what a thread count of 0 means
    for the engine, training, the benchmark report and the goldens, in place of torch's default
    (the affinity mask's size, which knows nothing of a cgroup's CPU limit)."""
    return read_cpu_quota().cores


def cpu_list(cpus: tuple[int, ...]) -> str:
    """0,1,2,3,8 -> '0-3,8' (the kernel's list format)."""
    ranges: list[str] = []
    for cpu in cpus:
        if ranges and cpu == int(ranges[-1].split("-")[-1]) + 1:
            ranges[-1] = f"{ranges[-1].split('-')[0]}-{cpu}"
        else:
            ranges.append(str(cpu))
    return ",".join(ranges) or "none"


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """'0-3,8' -> (0, 1, 2, 3, 8)."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return tuple(sorted(cpus))


def _affinity_from_status(status: Path) -> tuple[int, ...]:
    for line in status.read_text(encoding="utf-8").splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return parse_cpu_list(line.split(":", 1)[1])
    raise ValueError(f"{status}: no Cpus_allowed_list line")


def _cgroup_limit(root: Path, pid: str) -> tuple[float, str] | None:
    """(CPUs, file) of the smallest CPU bandwidth limit on this process's cgroup path, v2 or v1;
    None when none is set or none can be read (no cgroup filesystem: a limit nobody can see is
    not one to plan for)."""
    try:
        memberships = (root / "proc" / pid / "cgroup").read_text(encoding="utf-8").splitlines()
        mounts = (root / "proc" / pid / "mountinfo").read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    limits = []
    for directory, version in _cpu_cgroup_dirs(root, memberships, mounts):
        limit = _read_limit(directory, version)
        if limit is not None:
            limits.append(limit)
    return min(limits, default=None)


def _cpu_cgroup_dirs(root: Path, memberships: list[str], mounts: list[str]) -> list[tuple[Path, int]]:
    """The directories of this process's CPU cgroup and its ancestors (up to the mount's root),
    each with its cgroup version."""
    v1_path = v2_path = None
    for line in memberships:  # "hierarchy-id:controllers:path"
        hierarchy, controllers, path = line.split(":", 2)
        if hierarchy == "0" and controllers == "":
            v2_path = path
        elif "cpu" in controllers.split(","):
            v1_path = path
    found: list[tuple[Path, int]] = []
    for line in mounts:  # mountinfo: "id parent major:minor root mount-point options - fstype source super-options"
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        mount_root, mount_point = fields[3], fields[4]
        after = line.split(" - ", 1)[1].split()
        fstype, super_options = after[0], (after[2] if len(after) > 2 else "")
        if fstype == "cgroup2" and v2_path is not None:
            found += [(d, 2) for d in _ancestors(root, mount_root, mount_point, v2_path)]
        elif fstype == "cgroup" and v1_path is not None and "cpu" in super_options.split(","):
            found += [(d, 1) for d in _ancestors(root, mount_root, mount_point, v1_path)]
    return found


def _ancestors(root: Path, mount_root: str, mount_point: str, cgroup_path: str) -> list[Path]:
    """The cgroup's directory under the mount and each parent up to the mount point. A cgroup
    namespace shows the process's cgroup as '/' with the mount rooted there."""
    relative = cgroup_path
    if mount_root != "/" and relative.startswith(mount_root):
        relative = relative[len(mount_root) :]
    base = root / mount_point.lstrip("/")
    parts = [part for part in relative.split("/") if part]
    return [base.joinpath(*parts[:depth]) for depth in range(len(parts), -1, -1)]


def _read_limit(directory: Path, version: int) -> tuple[float, str] | None:
    try:
        if version == 2:  # "max 100000" or "200000 100000": quota and period in microseconds
            fields = (directory / "cpu.max").read_text(encoding="utf-8").split()
            if not fields or fields[0] == "max":
                return None
            quota_us, period_us = int(fields[0]), int(fields[1]) if len(fields) > 1 else 100_000
            return (quota_us / period_us, str(directory / "cpu.max")) if quota_us > 0 and period_us > 0 else None
        quota_us = int((directory / "cpu.cfs_quota_us").read_text(encoding="utf-8"))
        period_us = int((directory / "cpu.cfs_period_us").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if quota_us <= 0 or period_us <= 0:
        return None
    return quota_us / period_us, str(directory / "cpu.cfs_quota_us")
