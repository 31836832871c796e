"""The data benchmark's inputs: JSONL partitions of real demo text at a chosen size, copies
of one landed under other days, and the day each benchmark role uses. Apart from the
measurements (data_measurements.py) and the suite (data_bench.py), which both land them.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
from pathlib import Path

from aieng_core.config import DataConfig
from aieng_core.data.demo_data import corpus

# Bench partitions follow the demo days; Dagster only knows days from data.start_date to today.
FIRST_BENCH_DAY = 10
PARTITION_ROLES = ("cli", "warm-up", "round-1", "round-2", "round-3", "small", "large")


def write_synthetic_partition(folder: Path, target_bytes: int) -> Path:
    """JSONL of real demo text, each record a unique copy, until `target_bytes`."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "synthetic.jsonl"
    docs = corpus()
    written = copy = 0
    with open(path, "wb") as out:
        while written < target_bytes:
            for doc in docs:
                line = (
                    json.dumps({"id": f"{doc.id}#{copy}", "text": f"Copy {copy}. {doc.text}", "source": doc.source})
                    + "\n"
                )
                data = line.encode("utf-8")
                out.write(data)
                written += len(data)
                if written >= target_bytes:
                    break
            copy += 1
    return path


def land_copy(home: Path, partition: str, source: Path) -> Path:
    folder = home / "raw" / partition
    folder.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copyfile(source, folder / source.name))


def bench_partitions(data: DataConfig) -> dict[str, str]:
    """A day for each role, after the demo days; the Dagster CLI only accepts days up to today."""
    days = {
        role: (data.start_date + dt.timedelta(days=FIRST_BENCH_DAY + offset)).isoformat()
        for offset, role in enumerate(PARTITION_ROLES)
    }
    if days["cli"] > dt.date.today().isoformat():
        raise ValueError(
            f"data.start_date {data.start_date} is too recent: the Dagster CLI benchmark needs partition "
            f"{days['cli']}, which is after today"
        )
    return days
