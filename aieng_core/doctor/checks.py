"""`aieng doctor`: what this machine has, against what the configuration needs to run here.

Before anything runs (the seeds' inventory: GPU memory, free memory, disk, cores), one line
per resource with a verdict: `ok`, `warn` (it runs, worse than it could: say how) or `fail`
(the configuration cannot run here: say what is short, by how much). What the configuration
needs is computed from it, never measured by running it:

- memory for serving: the model's weights at the bundle's precision x 1.3 + 2 GiB (the seeds'
  budget rule, model/memory.py, the one the gate's warmup holds a server to) plus the
  KV-cache pool the bundle's limits preallocate (max_batch x max_context);
- disk under AIENG_HOME: a model checkpoint and a bundle of it (2 x the weights), twice over
  for the rollback target kept beside what serves, plus 1 GiB for data, logs and caches;
- cores: the cores this process really has (its affinity mask and its cgroup's CPU limit,
  cpu/quota.py: what a pod's `limits.cpu` or a `taskset` leaves it), and the thread counts
  the engine will step at: serving.threads (0: those cores), halved down to 1 while other
  processes take cores (serving.adapt_threads); more threads than cores is a warning;
- the device: serving.device cuda needs a CUDA device; with one, the memory rule is held
  against its free memory;
- the C++ compiler inductor needs to capture decode steps (serving.step_graphs), as the
  engine itself decides it (serving/step_graphs.py `unavailable`): without one the engine
  runs eagerly, so it is a warning.

`inventory()` reads the machine and `judge()` is a pure function of the two, so the verdicts
are tested on any machine.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from aieng_core.config import AiengConfig
from aieng_core.cpu.governor import thread_ladder
from aieng_core.cpu.quota import read_cpu_quota
from aieng_core.model.memory import BYTES_PER_PARAMETER, GIB, budget_bytes

Verdict = Literal["ok", "warn", "fail"]
LIBRARIES = ("torch", "dagster", "transformers", "tokenizers", "safetensors", "fastapi", "uvicorn", "jinja2")
DISK_HEADROOM_BYTES = GIB
COPIES_ON_DISK = 4  # a checkpoint and its bundle, and the same again for the rollback target


@dataclass(frozen=True)
class CudaDevice:
    name: str
    total_bytes: int
    free_bytes: int


@dataclass(frozen=True)
class Machine:
    """What this machine has (inventory())."""

    cores: int  # the threads this process can run at once (cpu/quota.py CpuQuota.cores)
    memory_total_bytes: int
    memory_available_bytes: int
    home: str
    disk_free_bytes: int
    home_writable: bool
    cuda: tuple[CudaDevice, ...]
    capture_unavailable: str | None  # step_graphs.unavailable on CPU; None: inductor can capture
    libraries: dict[str, str | None] = field(default_factory=dict)  # None: not installed
    python: str = platform.python_version()
    cpu_quota: str = ""  # where `cores` comes from: the affinity mask and the cgroup's CPU limit


@dataclass(frozen=True)
class Needs:
    """What the configuration needs (needs_of())."""

    parameters: int
    precision: str
    weights_bytes: int
    kv_cache_bytes: int
    prefix_cache_bytes: int
    serving_memory_bytes: int
    disk_bytes: int
    threads: int  # serving.threads as configured (0: the cores the process has)
    adapt_threads: bool  # serving.adapt_threads
    device: str
    step_graphs: str


@dataclass(frozen=True)
class Line:
    check: str
    verdict: Verdict
    have: str
    need: str
    detail: str = ""


def gib(value: int) -> str:
    return f"{value / GIB:.2f} GiB"


def needs_of(config: AiengConfig) -> Needs:
    """The model's size on the meta device (nothing allocated), the limits' KV pool and the
    server's prefix cache."""
    import torch

    from aieng_core.bundle.serving_bundle import kv_cache_bytes, prefix_cache_bytes
    from aieng_core.model.llama import LlamaConfig, LlamaForCausalLM

    model_config = LlamaConfig(vocab_size=config.tokenizer.vocab_size, **config.model.model_dump())
    with torch.device("meta"):
        parameters = LlamaForCausalLM(model_config).num_parameters()
    precision = config.bundle.weights
    weights = parameters * BYTES_PER_PARAMETER[precision]
    kv = kv_cache_bytes(model_config, config.bundle.max_batch, config.bundle.max_context)
    prefix = prefix_cache_bytes(model_config, config.serving.prefix_cache_tokens)
    return Needs(
        parameters=parameters,
        precision=precision,
        weights_bytes=weights,
        kv_cache_bytes=kv,
        prefix_cache_bytes=prefix,
        serving_memory_bytes=budget_bytes(parameters, precision) + kv + prefix,
        # fp32 on disk whatever serves: the checkpoint and the float32 source bundle are float32.
        disk_bytes=COPIES_ON_DISK * parameters * BYTES_PER_PARAMETER["fp32"] + DISK_HEADROOM_BYTES,
        threads=config.serving.threads,
        adapt_threads=config.serving.adapt_threads,
        device=config.serving.device,
        step_graphs=config.serving.step_graphs,
    )


def _existing_ancestor(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def inventory(home: Path) -> Machine:
    import psutil
    import torch

    from aieng_core.serving.step_graphs import COMPILE, unavailable

    cuda = []
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            free, total = torch.cuda.mem_get_info(index)
            cuda.append(CudaDevice(torch.cuda.get_device_name(index), int(total), int(free)))
    existing = _existing_ancestor(home)
    memory = psutil.virtual_memory()
    quota = read_cpu_quota()
    return Machine(
        cores=quota.cores,
        cpu_quota=quota.describe(),
        memory_total_bytes=int(memory.total),
        memory_available_bytes=int(memory.available),
        home=str(home),
        disk_free_bytes=int(shutil.disk_usage(existing).free),
        home_writable=os.access(existing, os.W_OK),
        cuda=tuple(cuda),
        capture_unavailable=unavailable(COMPILE, torch.device("cpu")),
        libraries={name: _version(name) for name in LIBRARIES},
    )


def judge(machine: Machine, needs: Needs) -> list[Line]:
    """One line per resource, with its verdict."""
    lines = [_cores(machine, needs), _memory(machine, needs), _disk(machine, needs), _device(machine, needs)]
    lines.append(_capture(machine, needs))
    missing = [name for name, version in machine.libraries.items() if version is None]
    installed = ", ".join(f"{name} {version}" for name, version in machine.libraries.items() if version)
    lines.append(
        Line(
            "libraries",
            "fail" if missing else "ok",
            f"python {machine.python}; {installed}",
            ", ".join(LIBRARIES),
            f"not installed: {', '.join(missing)} (run `make install`)" if missing else "",
        )
    )
    return lines


def _cores(machine: Machine, needs: Needs) -> Line:
    threads = needs.threads or machine.cores
    have = machine.cpu_quota or f"{machine.cores} usable cores"
    ladder = thread_ladder(threads) if needs.adapt_threads else (threads,)
    steps = f"the engine steps at {ladder[0]} thread{'s' if ladder[0] != 1 else ''}"
    if len(ladder) > 1:
        steps += f", {' or '.join(map(str, ladder[1:]))} while other processes take cores"
    need = f"serving.threads {needs.threads or 'auto'}: {steps}"
    if threads > machine.cores:
        detail = (
            f"{threads} threads on {machine.cores} cores: OpenMP threads wait on each other's descheduled "
            f"threads; set serving.threads to at most {machine.cores}"
        )
        return Line("cores", "warn", have, need, detail)
    return Line("cores", "ok", have, need)


def _memory(machine: Machine, needs: Needs) -> Line:
    have = f"{gib(machine.memory_available_bytes)} available of {gib(machine.memory_total_bytes)}"
    need = (
        f"{gib(needs.serving_memory_bytes)} to serve: weights ({needs.precision}, {needs.parameters:,} parameters) "
        f"{gib(needs.weights_bytes)} x 1.3 + 2 GiB, plus the KV-cache pool {gib(needs.kv_cache_bytes)} "
        f"and the prefix cache {gib(needs.prefix_cache_bytes)}"
    )
    if needs.serving_memory_bytes > machine.memory_available_bytes:
        short = needs.serving_memory_bytes - machine.memory_available_bytes
        detail = f"{gib(short)} short: a smaller model (model:), fewer sequences or less context (bundle:)"
        return Line("memory", "fail", have, need, detail)
    return Line("memory", "ok", have, need)


def _disk(machine: Machine, needs: Needs) -> Line:
    have = f"{gib(machine.disk_free_bytes)} free under {machine.home}"
    need = f"{gib(needs.disk_bytes)}: {COPIES_ON_DISK} x the float32 weights (checkpoints, bundles, rollback) + 1 GiB"
    if not machine.home_writable:
        return Line("disk", "fail", have, need, f"{machine.home} is not writable")
    if needs.disk_bytes > machine.disk_free_bytes:
        detail = (
            f"{gib(needs.disk_bytes - machine.disk_free_bytes)} short (`aieng store gc` frees what nothing reaches)"
        )
        return Line("disk", "fail", have, need, detail)
    return Line("disk", "ok", have, need)


def _device(machine: Machine, needs: Needs) -> Line:
    devices = "; ".join(
        f"cuda:{i} {d.name}, {gib(d.free_bytes)} free of {gib(d.total_bytes)}" for i, d in enumerate(machine.cuda)
    )
    have = devices or "no CUDA device"
    need = f"serving.device {needs.device}"
    if not machine.cuda:
        if needs.device == "cuda":
            return Line("device", "fail", have, need, "serving.device is cuda, and this machine has no CUDA device")
        return Line("device", "ok", have, need, "serving runs on the CPU")
    if needs.device == "cpu":
        return Line("device", "ok", have, need, "serving.device cpu: the CUDA device is left unused")
    free = machine.cuda[0].free_bytes
    if needs.serving_memory_bytes > free:
        detail = f"cuda:0 has {gib(free)} free, {gib(needs.serving_memory_bytes - free)} short of the memory rule"
        return Line("device", "fail", have, need, detail)
    return Line("device", "ok", have, need, f"serving runs on cuda:0 ({gib(needs.serving_memory_bytes)} needed)")


def _capture(machine: Machine, needs: Needs) -> Line:
    need = f"serving.step_graphs {needs.step_graphs}"
    if needs.step_graphs == "eager":
        return Line("step graphs", "ok", "not needed", need, "decode steps run eagerly, as configured")
    if needs.device != "cpu" and machine.cuda:
        return Line("step graphs", "ok", "CUDA device", need, "no inductor capture on CUDA")
    if machine.capture_unavailable is None:
        return Line("step graphs", "ok", "a C++ compiler for inductor", need)
    # The engine itself runs eagerly then, saying why in warmup's figures: slower, not broken.
    return Line(
        "step graphs", "warn", machine.capture_unavailable, need, "the server runs, with eager (slower) decode steps"
    )


def report(machine: Machine, needs: Needs) -> dict[str, Any]:
    lines = judge(machine, needs)
    return {
        "ok": all(line.verdict != "fail" for line in lines),
        "checks": [asdict(line) for line in lines],
        "machine": asdict(machine),
        "needs": asdict(needs),
    }


def format_report(result: dict[str, Any]) -> str:
    rows = [
        f"{c['verdict'].upper():4}  {c['check']:<12} have {c['have']}\n{'':18}need {c['need']}"
        for c in result["checks"]
    ]
    rows = [
        row + (f"\n{'':18}{check['detail']}" if check["detail"] else "") for row, check in zip(rows, result["checks"])
    ]
    verdict = "this configuration can run here" if result["ok"] else "this configuration cannot run here"
    return "\n".join([*rows, verdict])
