"""benchmark_report: a model's quality, speed and memory, measured beside its peers
(transformers `generate` on the same weights, and the bundle production serves)."""

from aieng_core.benchmark.benchmark_report import CODE_VERSION, KIND, REPORT_FILE, build_benchmark_report, read_report

__all__ = ["CODE_VERSION", "KIND", "REPORT_FILE", "build_benchmark_report", "read_report"]
