"""Gate step 1: the candidate is the bundle that was built. Every file re-hashed against its
manifest, the model loaded from safetensors, the golden prompts replayed through the engine
(bundle/verify.py's verify_bundle), inside the gate: a bundle changed since its asset check
ran is refused here."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from aieng_core.gate.report import GateFailed


def verify_step(bundle_path: Path, bundle_id: str) -> dict[str, Any]:
    from aieng_core.bundle.verify import verify_bundle

    started = time.perf_counter()
    report = verify_bundle(bundle_path)
    goldens = report["goldens"]
    figures: dict[str, Any] = {
        "bundle_path": str(bundle_path),
        "files_checked": report["files_checked"],
        "goldens_replayed": len(goldens),
        "goldens_matching": sum(1 for golden in goldens if golden["ok"]),
        "problems": report["problems"],
        "seconds": time.perf_counter() - started,
    }
    if report["bundle_id"] != bundle_id and not report["problems"]:
        problem = f"{bundle_path}/manifest.json names id {report['bundle_id']!r}, not {bundle_id!r}"
        figures["problems"] = [problem]
        raise GateFailed("verify", "bundle_id", problem, value=report["bundle_id"], limit=bundle_id, figures=figures)
    if not report["ok"]:
        problems = report["problems"] or ["verification failed"]
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise GateFailed(
            "verify",
            "problems",
            f"{problems[0]}{more}; `aieng bundle verify {bundle_path}` lists every problem; "
            # `aieng bundle build` bundles the current model and config (maybe another id); the
            # recorded recipe gives back this very candidate, the damaged copy moved aside.
            f"`aieng store rebuild {bundle_id}` rebuilds this exact bundle from its recorded recipe",
            value=len(problems),
            limit=0,
            figures=figures,
        )
    return figures
