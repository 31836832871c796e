"""aieng doctor: the verdicts from what a machine has and what a configuration needs (judge is a
pure function: any machine can be described), and the command on this machine, for real."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from aieng_core.config import load_config
from aieng_core.doctor.checks import LIBRARIES, CudaDevice, Machine, judge, needs_of, report
from aieng_core.model.memory import GIB, budget_bytes
from tests.conftest import REPO_ROOT, TINY_CONFIG

ROOMY = Machine(
    cores=8,
    memory_total_bytes=64 * GIB,
    memory_available_bytes=60 * GIB,
    home="/srv/aieng",
    disk_free_bytes=500 * GIB,
    home_writable=True,
    cuda=(),
    capture_unavailable=None,
    libraries={name: "1.0" for name in LIBRARIES},
)


def verdicts(machine: Machine, config=None) -> dict[str, str]:
    needs = needs_of(config or load_config(TINY_CONFIG))
    return {line.check: line.verdict for line in judge(machine, needs)}


def test_a_roomy_machine_passes_every_check() -> None:
    assert verdicts(ROOMY) == dict.fromkeys(["cores", "memory", "disk", "device", "step graphs", "libraries"], "ok")


def test_the_memory_need_is_the_budget_rule_plus_the_kv_pool_and_the_prefix_cache() -> None:
    config = load_config(TINY_CONFIG)
    needs = needs_of(config)
    from aieng_core.bundle.serving_bundle import kv_cache_bytes
    from aieng_core.model.llama import LlamaConfig

    model_config = LlamaConfig(vocab_size=config.tokenizer.vocab_size, **config.model.model_dump())
    assert needs.kv_cache_bytes == kv_cache_bytes(model_config, config.bundle.max_batch, config.bundle.max_context)
    assert needs.weights_bytes == needs.parameters * 4
    # Every position the prefix cache holds costs what a pool position costs, keys and values of every layer.
    per_position = kv_cache_bytes(model_config, 1, 1) // 2  # a slot is max_context + 1 (scratch) positions
    assert needs.prefix_cache_bytes == config.serving.prefix_cache_tokens * per_position > 0
    # The rule the gate's warmup holds a server to (model/memory.py), to the byte, plus both caches.
    assert needs.serving_memory_bytes == (
        budget_bytes(needs.parameters, "fp32") + needs.kv_cache_bytes + needs.prefix_cache_bytes
    )
    assert abs(budget_bytes(needs.parameters, "fp32") - (needs.weights_bytes * 1.3 + 2 * GIB)) < 1e-4 * GIB
    int8 = needs_of(config.model_copy(update={"bundle": config.bundle.model_copy(update={"weights": "int8"})}))
    assert int8.weights_bytes == needs.parameters and int8.disk_bytes == needs.disk_bytes


def test_short_memory_fails_naming_how_much() -> None:
    needs = needs_of(load_config(TINY_CONFIG))
    machine = replace(ROOMY, memory_available_bytes=needs.serving_memory_bytes - GIB)
    [memory] = [line for line in judge(machine, needs) if line.check == "memory"]
    assert memory.verdict == "fail" and memory.detail.startswith("1.00 GiB short")
    assert report(machine, needs)["ok"] is False


def test_a_model_too_big_for_this_machine_fails_memory_and_disk() -> None:
    tiny = load_config(TINY_CONFIG)
    huge = tiny.model_copy(
        update={"model": tiny.model.model_copy(update={"hidden_size": 8192, "intermediate_size": 28672})}
    )
    assert needs_of(huge).parameters > 1_000_000_000
    found = verdicts(replace(ROOMY, memory_available_bytes=8 * GIB, disk_free_bytes=8 * GIB), huge)
    assert (found["memory"], found["disk"]) == ("fail", "fail")


@pytest.mark.parametrize(
    ("change", "serving", "check", "verdict"),
    [
        ({"cores": 2}, {"threads": 4}, "cores", "warn"),
        ({"cores": 4}, {"threads": 4}, "cores", "ok"),
        ({}, {"device": "cuda"}, "device", "fail"),
        ({"cuda": (CudaDevice("H200", 140 * GIB, 139 * GIB),)}, {"device": "cuda"}, "device", "ok"),
        ({"cuda": (CudaDevice("tiny", 2 * GIB, GIB),)}, {"device": "auto"}, "device", "fail"),
        ({"capture_unavailable": "not captured: no C++ compiler"}, {"step_graphs": "compile"}, "step graphs", "warn"),
        ({"capture_unavailable": "not captured: no C++ compiler"}, {"step_graphs": "auto"}, "step graphs", "warn"),
        ({"capture_unavailable": "not captured: no C++ compiler"}, {"step_graphs": "eager"}, "step graphs", "ok"),
        ({"home_writable": False}, {}, "disk", "fail"),
        ({"libraries": {**ROOMY.libraries, "torch": None}}, {}, "libraries", "fail"),
    ],
    ids=[
        "oversubscribed",
        "threads-fit",
        "cuda-missing",
        "cuda-roomy",
        "cuda-small",
        "no-compiler-compile",
        "no-compiler-auto",
        "no-compiler-eager",
        "home-read-only",
        "torch-missing",
    ],
)
def test_each_check_judges_its_resource(change: dict, serving: dict, check: str, verdict: str) -> None:
    config = load_config(TINY_CONFIG)
    config = config.model_copy(update={"serving": config.serving.model_copy(update=serving)})
    assert verdicts(replace(ROOMY, **change), config)[check] == verdict


def run_doctor(tmp_path: Path, *arguments: str, config: Path = TINY_CONFIG) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "aieng_core.cli",
            "--home",
            str(tmp_path / "home"),
            "--config",
            str(config),
            "doctor",
            *arguments,
        ],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=120,
    )


def cores_line(machine: Machine, **serving) -> tuple[str, str, str]:
    config = load_config(TINY_CONFIG)
    config = config.model_copy(update={"serving": config.serving.model_copy(update=serving)})
    line = next(line for line in judge(machine, needs_of(config)) if line.check == "cores")
    return line.verdict, line.have, line.need


def test_the_cores_line_says_the_quota_and_the_engines_thread_counts() -> None:
    machine = replace(ROOMY, cpu_quota="8 cores (affinity 0-7; no cgroup CPU limit)")
    assert cores_line(machine) == (
        "ok",
        "8 cores (affinity 0-7; no cgroup CPU limit)",
        "serving.threads auto: the engine steps at 8 threads, 4 or 2 or 1 while other processes take cores",
    )
    assert cores_line(machine, adapt_threads=False)[2] == "serving.threads auto: the engine steps at 8 threads"
    assert cores_line(replace(ROOMY, cores=1), threads=0)[2] == "serving.threads auto: the engine steps at 1 thread"
    assert cores_line(replace(ROOMY, cores=2), threads=4)[0] == "warn"


def test_the_command_under_taskset_sees_one_core(tmp_path: Path) -> None:
    """The affinity mask a `taskset -c 0` gives (os.sched_setaffinity in the child, as taskset does)."""
    done = subprocess.run(
        [sys.executable, "-c", "import os, sys; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
         "from aieng_core.cli import main; sys.exit(main(sys.argv[1:]))",
         "--home", str(tmp_path / "home"), "--config", str(TINY_CONFIG), "doctor", "--json"],
        capture_output=True, text=True, cwd=REPO_ROOT, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    cores = next(check for check in result["checks"] if check["check"] == "cores")
    assert result["machine"]["cores"] == 1
    assert cores["have"].startswith("1 core (affinity ") and cores["need"].endswith("the engine steps at 1 thread")


def test_the_command_on_this_machine(tmp_path: Path) -> None:
    done = run_doctor(tmp_path, "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["ok"] is True
    assert [c["check"] for c in result["checks"]] == ["cores", "memory", "disk", "device", "step graphs", "libraries"]
    machine = result["machine"]
    assert machine["cores"] >= 1 and machine["memory_available_bytes"] > 0 and machine["disk_free_bytes"] > 0
    assert machine["home"] == str(tmp_path / "home") and machine["libraries"]["torch"].startswith("2.")
    human = run_doctor(tmp_path)
    assert human.returncode == 0 and human.stdout.rstrip().endswith("this configuration can run here")


def test_a_configuration_this_machine_cannot_run_exits_1(tmp_path: Path) -> None:
    """serving.device cuda on this CPU-only machine (CI has no GPU)."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    config = tmp_path / "cuda.yaml"
    settings = yaml.safe_load(TINY_CONFIG.read_text(encoding="utf-8"))
    settings["serving"]["device"] = "cuda"
    config.write_text(yaml.safe_dump(settings), encoding="utf-8")
    done = run_doctor(tmp_path, config=config)
    assert done.returncode == 1
    assert "FAIL  device" in done.stdout and "this machine has no CUDA device" in done.stdout
    assert done.stdout.rstrip().endswith("this configuration cannot run here")
