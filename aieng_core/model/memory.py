"""Memory budget of a model: what its weights take at each precision, and the seeds' rule
of thumb for the accelerator memory to ask for (weights x 1.3 + 2 GiB of headroom for
activations, KV cache, CUDA context and fragmentation)."""

from __future__ import annotations

GIB = 1024**3
BYTES_PER_PARAMETER = {"fp32": 4, "bf16": 2, "int8": 1}


def memory_budget(num_parameters: int) -> dict[str, int | float]:
    budget: dict[str, int | float] = {
        f"weights_bytes_{name}": num_parameters * size for name, size in BYTES_PER_PARAMETER.items()
    }
    for name, size in BYTES_PER_PARAMETER.items():
        budget[f"gpu_rule_gib_{name}"] = round(num_parameters * size * 1.3 / GIB + 2.0, 4)
    return budget


def budget_bytes(num_parameters: int, precision: str) -> int:
    """The rule's memory for weights at `precision`, in bytes: what the gate holds a server to,
    the report a model to, and `aieng doctor` a machine to."""
    return int(memory_budget(num_parameters)[f"gpu_rule_gib_{precision}"] * GIB)
