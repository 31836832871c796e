"""`aieng bench data`: the data path against its fastest honest peers, on the same bytes.

- raw -> tokenized, in-process: the whole artifact path (snapshot, decode, contract, clean,
  Parquet, tokenize, Parquet, hashes) against bare `Tokenizer.encode_batch_fast` -- the call
  tokenized_documents makes, on a tokenizer loaded the same way -- over exactly the clean
  texts it tokenizes; both warmed up once, then best of 3, taking turns in one process;
- raw -> tokenized through the Dagster CLI: two `dagster asset materialize` calls on one
  partition against bare JSON parsing, `clean_text` and `encode_batch_fast` over the same
  file in this process; the fixed cost of a call (start-up, run bookkeeping) is measured apart;
- clean + validate: our batched contract + cleaner vs a per-row pydantic model that cleans
  in a validator (the seeds' approach), over the same parsed records;
- hashing: our file hashing vs `hashlib.file_digest` on the same file (in the page cache),
  and canonical content hashing (what manifests record) vs one `hashlib.sha256` over the
  same bytes in memory;
- memory: peak RSS of a large partition in a fresh process, and its time against the small
  partition's in a fresh process.

The config comes from `--config`, else $AIENG_CONFIG, else configs/pipeline.yaml.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aieng_core.bench.data_measurements import (
    bench_clean_validate,
    bench_dagster_cli,
    bench_hashing,
    bench_raw_to_tokenized,
    run_partition,
)
from aieng_core.bench.synthetic_data import bench_partitions, land_copy, write_synthetic_partition
from aieng_core.config import load_config, resolve_config_path
from aieng_core.data.clean_documents import build_clean_documents
from aieng_core.data.demo_data import land_demo_data
from aieng_core.data.raw_documents import build_raw_documents
from aieng_core.output import write_results
from aieng_core.store import ArtifactStore
from aieng_core.tokenizer.bpe_tokenizer import build_bpe_tokenizer

GOALS = {
    "raw_to_tokenized_vs_encode_batch_fast": (">=", 0.8),
    "dagster_cli_vs_bare_clean_encode": (">=", 0.6),
    "file_hashing_vs_file_digest": (">=", 0.8),
    "content_hashing_vs_hashlib": (">=", 0.8),
    "large_partition_peak_rss_mib": ("<", 1024.0),
    "large_vs_small_time_ratio": ("<=", 11.0),
}
COMPARE: dict[str, Callable[[float, float], bool]] = {
    ">=": lambda value, goal: value >= goal,
    "<": lambda value, goal: value < goal,
    "<=": lambda value, goal: value <= goal,
}


def goals(values: dict[str, float]) -> dict[str, dict[str, Any]]:
    """Each goal with its value and whether it is met; a missed one says by how much."""
    results = {}
    for name, (op, goal) in GOALS.items():
        value = values[name]
        met = COMPARE[op](value, goal)
        results[name] = {
            "value": value,
            "goal": f"{op} {goal}",
            "met": met,
            "missed_by": None if met else abs(value - goal),
        }
    return results


def run_data_bench(
    size_mb: float = 20.0,
    large_mb: float = 200.0,
    cli_mb: float = 40.0,
    out: str | None = None,
    config: str | None = None,
) -> dict[str, Any]:
    config_path = resolve_config_path(config)
    settings = load_config(config_path)
    days = bench_partitions(settings.data)
    load_before = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="aieng-bench-"))
    try:
        home = work / "home"
        store = ArtifactStore(home)
        # A tokenizer trained on the demo corpus, as in the pipeline (not timed).
        land_demo_data(home, start_date=settings.data.start_date)
        for offset in range(3):
            day = (settings.data.start_date + dt.timedelta(days=offset)).isoformat()
            build_raw_documents(store, settings, day)
            build_clean_documents(store, settings, day)
        build_bpe_tokenizer(store, settings)

        small_raw = write_synthetic_partition(work / "synthetic", int(size_mb * 1e6))
        write_synthetic_partition(home / "raw" / days["cli"], int(cli_mb * 1e6))
        # First, while the store holds no other bench partition for the calls' checks to visit.
        dagster_cli = bench_dagster_cli(store, config_path, settings, days["cli"])
        rounds = [days["warm-up"], days["round-1"], days["round-2"], days["round-3"]]
        raw_to_tokenized = bench_raw_to_tokenized(store, settings, small_raw, rounds)
        clean_validate = bench_clean_validate(small_raw, settings.data.batch_rows, settings.data)
        hashing = bench_hashing(store, small_raw, days["round-1"])
        land_copy(home, days["small"], small_raw)
        write_synthetic_partition(home / "raw" / days["large"], int(large_mb * 1e6))
        small = run_partition(home, config_path, days["small"])
        large = run_partition(home, config_path, days["large"])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    results: dict[str, Any] = {
        "suite": "data",
        "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            # Other work on the machine skews every figure; these say how much there was.
            "load_average_before": load_before[0],
            "load_average_after": os.getloadavg()[0],
        },
        "config": str(config_path),
        "clean_validate": clean_validate,
        "raw_to_tokenized": raw_to_tokenized,
        "dagster_cli": dagster_cli,
        "hashing": hashing,
        "memory": {
            "small": small,
            "large": large,
            "large_peak_rss_mib": large["peak_rss_mib"],
            "time_ratio": large["seconds"]["total"] / small["seconds"]["total"],
            "size_ratio": large["bytes"] / small["bytes"],
        },
    }
    results["goals"] = goals(
        {
            "raw_to_tokenized_vs_encode_batch_fast": raw_to_tokenized["fraction_of_encode_batch_fast"],
            "dagster_cli_vs_bare_clean_encode": dagster_cli["vs_bare_clean_encode"],
            "file_hashing_vs_file_digest": hashing["file_hashing_vs_file_digest"],
            "content_hashing_vs_hashlib": hashing["content_hashing_vs_hashlib"],
            "large_partition_peak_rss_mib": large["peak_rss_mib"],
            "large_vs_small_time_ratio": results["memory"]["time_ratio"],
        }
    )
    write_results(out, results)
    return results


def format_results(results: dict[str, Any]) -> str:
    cv, rt, cli = results["clean_validate"], results["raw_to_tokenized"], results["dagster_cli"]
    h, m = results["hashing"], results["memory"]
    stages, beyond = rt["pipeline_seconds"], rt["seconds_beyond_encode"]
    bare = cli["peer_seconds"]
    lines = [
        f"raw->tokenized   {rt['pipeline_mb_s']:.2f} MB/s vs bare {rt['peer']} {rt['encode_mb_s']:.2f} MB/s "
        f"(fraction {rt['fraction_of_encode_batch_fast']:.2f}); stages raw {stages['raw']:.2f} s, clean "
        f"{stages['clean']:.2f} s, tokenized {stages['tokenized']:.2f} s (of which beyond encode "
        f"{beyond['tokenized']:.2f} s)",
        f"dagster CLI      {cli['raw_mb']:.0f} MB in {cli['cli_seconds']:.1f} s over {len(cli['call_seconds'])} calls "
        f"({cli['fixed_seconds_per_call']:.1f} s fixed per call, code location import "
        f"{cli['code_location_import_seconds']:.1f} s) vs bare {bare['total']:.1f} s (parse {bare['parse']:.1f}, "
        f"clean {bare['clean']:.1f}, encode {bare['encode']:.1f})  (ratio {cli['vs_bare_clean_encode']:.2f})",
        f"clean+validate   ours {cv['ours_mb_s']:.1f} MB/s vs same cleaner with per-row pydantic "
        f"{cv['same_cleaner_per_row_pydantic_mb_s']:.1f} MB/s "
        f"(x{cv['speedup_vs_per_row_pydantic']:.2f}); seeds' per-row loop {cv['seeds_per_row_loop_mb_s']:.1f} "
        f"MB/s (x{cv['speedup_vs_seeds_loop']:.2f})",
        f"file hashing     {h['file_hashing_mb_s']:.0f} MB/s vs hashlib.file_digest {h['file_digest_mb_s']:.0f} MB/s  "
        f"(ratio {h['file_hashing_vs_file_digest']:.2f})",
        f"content hashing  {h['content_hashing_mb_s']:.0f} MB/s vs hashlib {h['hashlib_mb_s']:.0f} MB/s  (ratio "
        f"{h['content_hashing_vs_hashlib']:.2f})",
        f"large partition  {m['large']['bytes'] / 1e6:.0f} MB: peak RSS {m['large_peak_rss_mib']:.0f} MiB, "
        f"time x{m['time_ratio']:.2f} for x{m['size_ratio']:.1f} the data",
        f"load average     {results['machine']['load_average_before']:.1f} before, "
        f"{results['machine']['load_average_after']:.1f} after, on {results['machine']['cpus']} CPUs",
        "goals:",
    ]
    lines += [
        f"  {'met ' if g['met'] else 'MISS'}  {name}: {g['value']:.3f} (goal {g['goal']}"
        + ("" if g["met"] else f", missed by {g['missed_by']:.3f}")
        + ")"
        for name, g in results["goals"].items()
    ]
    return "\n".join(lines)
