"""`device: auto` means CUDA when present, else CPU (DESIGN §5); any other value is used as given."""

from __future__ import annotations


def resolve_device(device: str) -> str:
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
