"""The serving bundle: the model, its tokenizer, serving limits, golden outputs and benchmark
report in one immutable artifact (serving_bundle.py), recorded and replayed goldens
(golden.py), and the verification every load goes through (verify.py)."""

from aieng_core.bundle.serving_bundle import (
    CODE_VERSION,
    KIND,
    build_serving_bundle,
    produce_bundle_files,
)
from aieng_core.bundle.verify import BundleVerificationError, LoadedBundle, load_bundle, verify_bundle

__all__ = [
    "CODE_VERSION",
    "KIND",
    "BundleVerificationError",
    "LoadedBundle",
    "build_serving_bundle",
    "load_bundle",
    "produce_bundle_files",
    "verify_bundle",
]
