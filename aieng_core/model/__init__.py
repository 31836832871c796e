"""The language model: a Llama-architecture decoder in plain PyTorch, HF-compatible on disk."""
