"""Where the engine runs: the device (`auto` means CUDA when present, else CPU; any other
value is used as given) and the torch thread count a block runs with."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


def resolve_device(device: str) -> str:
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


@contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """Run the block with `threads` torch intra-op threads, then restore the previous count."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)
