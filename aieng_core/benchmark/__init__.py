"""benchmark_report: a model's quality, speed and memory, measured beside its peer
(transformers `generate` on the same weights)."""

from aieng_core.benchmark.benchmark_report import CODE_VERSION, KIND, REPORT_FILE, build_benchmark_report, read_report

__all__ = ["CODE_VERSION", "KIND", "REPORT_FILE", "build_benchmark_report", "read_report"]
