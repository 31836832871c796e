"""Helpers of test_dagster_ui_pages.py: reading an asset page's metadata table as drawn, and a
gate report of a second promotion (the figures a real gate run records, trimmed to the ones
the asset's metadata is made from)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

# The overview's metadata table (ui-core AssetEventMetadataEntriesTable.tsx): Key, Timestamp, Value.
METADATA_ROWS = 'table[class*="styledTableWithHeader"] > tbody > tr'
SHOW_NUX = "query { shouldShowNux }"
# Each row as drawn: its key, the value's text, where the row starts, the right end of what its
# value draws (text and images) against the right edge of the table's scroll container, and
# each image: an SVG data URI, and drawn (loaded, with a size).
READ_ROWS = """selector => {
    const edge = document.querySelector('[class*="assetEventMetadataScrollContainer"]').getBoundingClientRect().right;
    const drawnRight = cell => {
        let right = cell.getBoundingClientRect().left;
        const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
        for (let node = walker.nextNode(); node; node = walker.nextNode()) {
            const range = document.createRange();
            range.selectNodeContents(node);
            for (const rect of range.getClientRects()) right = Math.max(right, rect.right);
        }
        for (const image of cell.querySelectorAll('img')) right = Math.max(right, image.getBoundingClientRect().right);
        return right;
    };
    return Array.from(document.querySelectorAll(selector)).filter(row => row.cells.length >= 3).map(row => {
        const cell = row.cells[2];
        return {
            key: row.cells[0].innerText.trim(),
            value: cell.innerText,
            top: row.getBoundingClientRect().top,
            right: drawnRight(cell),
            edge,
            images: Array.from(cell.querySelectorAll('img'), image => ({
                svg: image.src.startsWith('data:image/svg+xml'),
                drawn: image.complete && image.naturalWidth > 0,
            })),
        };
    });
}"""

DEPLOYED = "d" * 16  # what production served before this promotion


def _level(concurrency: int | None, ttft_p99: float, e2el_p99: float, tokens_per_second: float) -> dict[str, Any]:
    level: dict[str, Any] = {
        "planned": 12,
        "errors": 0,
        "rejected_429": 0,
        "good_fraction": 1.0,
        "output_throughput": tokens_per_second,
        "ttft_ms": {"p50": ttft_p99 / 2, "p99": ttft_p99},
        "tpot_ms": {"p50": 1.4, "p99": 3.6},
        "itl_ms": {"p50": 1.4, "p99": 11.0},
        "e2el_ms": {"p50": e2el_p99 / 2, "p99": e2el_p99},
    }
    return level | ({"concurrency": concurrency} if concurrency else {"rate_per_s": 8.0})


def gate_report(bundle_id: str, path: Path) -> dict[str, Any]:
    """A passed gate that promoted `bundle_id` over DEPLOYED as production's sequence 2."""
    event = {"action": "promote", "from": DEPLOYED, "to": bundle_id, "sequence": 2, "pointer": "production"}
    event |= {"actor": "on-call@example", "reason": "gate passed", "time": "2026-12-01T14:31:53.937+00:00"}
    levels = {
        "concurrency=1": _level(1, 13.36, 31.95, 374.0),
        "concurrency=4": _level(4, 88.65, 170.0, 273.5),
        "poisson=8": _level(None, 12.47, 41.83, 126.8),
    }
    figures = {
        "verify": {"files_checked": 9, "goldens_matching": 3, "goldens_replayed": 3},
        "quality": {
            "candidate": {"bits_per_byte": 3.47973, "bundle_id": bundle_id},
            "deployed": {"bits_per_byte": 3.49012, "bundle_id": DEPLOYED},
            "unigram": {"bits_per_byte": 3.78725},
            "worse_by": -0.00298,
        },
        "warmup": {
            "device": "cpu",
            "cold_first_request_ms": 62.7,
            "warm_first_request_ms": 19.7,
            "peak_memory_bytes": 1425408,
            "memory_budget_bytes": 2148127893,
            "step_graphs": {"status": "captured: batch buckets [1, 2, 4, 8, 16] (torch.compile, inductor)"},
        },
        "compare": {
            "note": f"candidate vs deployed {DEPLOYED}, served in this run: no regression",
            "decision": {"ratio": 0.982, "interval": [0.951, 1.013], "verdict": "no regression"},
        },
        "stress": {"levels": levels},
        "drill": {
            "pickup_seconds": 1.83,
            "time_to_rollback_seconds": 0.0817,
            "traffic": {"ok": 22, "failed_requests": 0},
        },
        "promote": {"from": DEPLOYED, "to": bundle_id, "sequence": 2},
    }
    seconds = {"verify": 3.3, "quality": 16.1, "warmup": 1.7, "compare": 41.2, "stress": 23.3, "drill": 33.8}
    return {
        "bundle_id": bundle_id,
        "path": str(path),
        "passed": True,
        "failure": None,
        "event": event,
        "production_before": {"bundle_id": DEPLOYED, "sequence": 1},
        "steps": [
            {"name": name, "passed": True, "seconds": seconds.get(name, 0.01), "figures": step}
            for name, step in figures.items()
        ],
    }
