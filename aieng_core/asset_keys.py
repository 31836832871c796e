"""The asset keys of the graph (a contract: docs/index.md, "The asset graph"), in one torch-free place.

Each capability module names its own key from here, and whatever only needs the names
(status, lineage) imports this module instead of the heavy ones.
"""

RAW_DOCUMENTS = "raw_documents"
CLEAN_DOCUMENTS = "clean_documents"
BPE_TOKENIZER = "bpe_tokenizer"
TOKENIZED_DOCUMENTS = "tokenized_documents"
DATASET_MANIFEST = "dataset_manifest"
MODEL_CHECKPOINT = "model_checkpoint"
BENCHMARK_REPORT = "benchmark_report"
SERVING_BUNDLE = "serving_bundle"
PRODUCTION_DEPLOYMENT = "production_deployment"
