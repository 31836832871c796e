"""One partition through raw -> clean -> tokenized, timing each stage.

`run_stages` runs in the caller's process (the in-process benchmark calls it). Run as
`python -m aieng_core.bench.partition_run HOME CONFIG PARTITION` for a fresh process whose
peak RSS is the partition's own; prints one JSON line with the wall time of each stage and
that peak RSS.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path
from typing import Any

from aieng_core.config import AiengConfig, load_config
from aieng_core.data.clean_documents import build_clean_documents
from aieng_core.data.raw_documents import build_raw_documents
from aieng_core.store import ArtifactStore
from aieng_core.tokenizer.tokenized_documents import build_tokenized_documents


def run_stages(store: ArtifactStore, config: AiengConfig, partition: str) -> dict[str, Any]:
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
    }


def peak_rss_mib() -> float:
    """This process's peak RSS. From /proc where there is one: Linux keeps ru_maxrss across
    fork and exec, so there it starts at the RSS of the process that started us."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(home: str, config_path: str, partition: str) -> dict[str, Any]:
    result = run_stages(ArtifactStore(Path(home)), load_config(config_path), partition)
    return {**result, "peak_rss_mib": peak_rss_mib()}


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:4])))
