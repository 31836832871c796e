"""One partition through raw -> clean -> tokenized in a fresh process, for peak memory.

Run as `python -m aieng_core.bench.partition_run HOME CONFIG PARTITION`; prints one JSON
line with the wall time of each stage and the process's peak RSS.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path

from aieng_core.config import load_config
from aieng_core.data.clean_documents import build_clean_documents
from aieng_core.data.raw_documents import build_raw_documents
from aieng_core.store import ArtifactStore
from aieng_core.tokenizer.tokenized_documents import build_tokenized_documents


def main(home: str, config_path: str, partition: str) -> dict:
    store, config = ArtifactStore(Path(home)), load_config(config_path)
    seconds = {}
    start = time.perf_counter()
    raw = build_raw_documents(store, config, partition)
    seconds["raw"] = time.perf_counter() - start
    clean = build_clean_documents(store, config, partition)
    seconds["clean"] = time.perf_counter() - start - seconds["raw"]
    tokenized = build_tokenized_documents(store, config, partition)
    seconds["tokenized"] = time.perf_counter() - start - seconds["raw"] - seconds["clean"]
    return {
        "partition": partition,
        "bytes": raw.metrics["bytes"],
        "rows_clean": clean.metrics["rows_clean"],
        "tokens": tokenized.metrics["tokens"],
        "seconds": {**seconds, "total": time.perf_counter() - start},
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:4])))
