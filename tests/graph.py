"""The asset graph the docs promise (docs/index.md, "The asset graph": the asset keys are a
contract), in graph order: what the code location's
shape is checked against (tests/orchestration/test_definitions.py) and the chain the crash
tests materialize (tests/e2e/test_crash_safety.py). Plain data: importing it loads nothing."""

ASSET_GRAPH = [
    "raw_documents",
    "clean_documents",
    "bpe_tokenizer",
    "tokenized_documents",
    "dataset_manifest",
    "model_checkpoint",
    "benchmark_report",
    "serving_bundle",
    "production_deployment",
]
