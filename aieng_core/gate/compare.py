"""Gate step 3: the candidate beside the bundle production serves, measured in the same run.

Both bundles' models run through our engine, each with its own serving limits, in this
process, on CPU, at each `benchmark.batch_sizes` (prompts of `benchmark.prompt_tokens`,
`benchmark.new_tokens` generated, greedy, EOS ignored): warmed up, timed with the order
alternated (benchmark/speed.side_by_side), the median with its spread. Measuring both now,
under the same load, is what makes the ratio mean something: figures recorded when the
deployed bundle was promoted were measured under another load.

This step records the figures (in the gate report and the promotion event) and refuses
nothing: the stress step's SLOs and regression bound decide. On a first deployment there is
nothing to compare with, and the figures say so.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aieng_core.asset_keys import MODEL_CHECKPOINT, SERVING_BUNDLE
from aieng_core.config import AiengConfig
from aieng_core.deploy.deployments import Deployments
from aieng_core.store import ArtifactIntegrityError, ArtifactNotFound
from aieng_core.store.artifacts import input_ids

DEVICE = "cpu"


def compare_step(candidate_path: Path, production: Deployments, config: AiengConfig) -> dict[str, Any]:
    import torch

    from aieng_core.benchmark import speed
    from aieng_core.bundle.verify import load_bundle
    from aieng_core.serving.device import torch_threads

    bench = config.benchmark
    threads = bench.threads or torch.get_num_threads()
    figures: dict[str, Any] = {
        "device": DEVICE,
        "threads": threads,
        "prompt_tokens": bench.prompt_tokens,
        "new_tokens": bench.new_tokens,
        "deployed_bundle_id": None,
        "throughput": [],
    }
    deployed_id = production.current()["bundle_id"]
    if deployed_id is None:
        figures["note"] = "first deployment: nothing is deployed, so there is nothing to compare with"
        return figures
    figures["deployed_bundle_id"] = deployed_id
    needed = bench.prompt_tokens + bench.new_tokens
    with torch_threads(threads):
        # The candidate was verified by the verify step; both bundles' files are re-hashed as
        # they load. A deployed bundle that cannot be loaded is production's problem, said in
        # the figures (`aieng store verify` names it): it does not stop this candidate.
        candidate = load_bundle(candidate_path, DEVICE, check_goldens=False)
        try:
            deployed = load_bundle(production.store.get(SERVING_BUNDLE, deployed_id).path, DEVICE, check_goldens=False)
        except (ArtifactNotFound, ArtifactIntegrityError, OSError, ValueError) as exc:
            figures["note"] = f"not compared: the deployed bundle {deployed_id} cannot be loaded: {exc}"
            return figures
        loaded = {"candidate": candidate, "deployed": deployed}
        models = [input_ids(bundle.manifest, MODEL_CHECKPOINT) for bundle in loaded.values()]
        figures["same_model"] = models[0] == models[1]
        short = [name for name, bundle in loaded.items() if int(bundle.serving["max_context"]) < needed]
        if short:
            figures["note"] = (
                f"not compared: benchmark.prompt_tokens + benchmark.new_tokens ({needed}) exceed the max_context of "
                f"the {' and '.join(short)} bundle"
            )
            return figures
        largest = max(bench.batch_sizes)
        engines = {name: bundle.make_engine(max_waiting=largest) for name, bundle in loaded.items()}
        for size in bench.batch_sizes:
            peers = {
                name: (
                    speed.engine_generate(engine),
                    speed.benchmark_prompts(engine.encode, engine.eos_token_id, size, bench.prompt_tokens),
                )
                for name, engine in engines.items()
            }
            measured, _ = speed.side_by_side(peers, bench.new_tokens)
            ratio = measured["candidate"]["tokens_per_second"] / measured["deployed"]["tokens_per_second"]
            figures["throughput"].append({"batch_size": size, **measured, "ratio_vs_deployed": ratio})
    ratios = ", ".join(f"batch {row['batch_size']}: {row['ratio_vs_deployed']:.2f}" for row in figures["throughput"])
    figures["note"] = f"candidate / deployed {figures['deployed_bundle_id']} tokens/s, measured now: {ratios}"
    return figures
