"""model_checkpoint: the language model, trained from scratch."""

import base64
from collections.abc import Callable, Mapping, Sequence

import dagster as dg

from aieng_core.training import model_checkpoint as checkpoint
from aieng_core.training.bits_per_byte import bits_per_byte, tokens_per_byte
from orchestration.assets.dataset import dataset_manifest
from orchestration.metadata import materialize_one, run_info
from orchestration.partitions import single_run
from orchestration.resources import AiengResource


@dg.asset(
    key=checkpoint.KIND,
    deps=[dataset_manifest],
    backfill_policy=single_run,
    code_version=checkpoint.CODE_VERSION,
    group_name="model",
    kinds={"pytorch", "safetensors"},
    description=(
        "Llama-architecture LM trained from scratch on the dataset manifest's train split, saved as "
        "Hugging Face safetensors with its tokenizer. Resumes from its last checkpoint if killed. A run stopped by "
        "max_minutes publishes a partial model (metadata partial=true) under an id of its own; the next run resumes."
    ),
)
def model_checkpoint(context: dg.AssetExecutionContext, aieng: AiengResource) -> dg.MaterializeResult:
    store = aieng.store()
    artifact = checkpoint.build_model_checkpoint(
        store, aieng.settings(), run_info(context), context.log, launcher=pipes_launcher(context)
    )
    metrics = artifact.metrics
    context.log.info(f"model_checkpoint: {'reused' if artifact.reused else 'trained'} {artifact.id}")
    png = base64.b64encode(artifact.file(checkpoint.LOSS_CURVE_FILE).read_bytes()).decode("ascii")
    progress = f"{metrics['steps']} of {metrics['max_steps']} steps"
    training = (
        f"**partial model**: stopped by max_minutes after {progress}; materialize again to resume to max_steps"
        if metrics["partial"]
        else f"complete: {progress}"
    )
    return materialize_one(
        artifact,
        {
            **{name: metrics[name] for name in checkpoint.NUMERIC_METRICS if metrics.get(name) is not None},
            "stopped_by": metrics["stopped_by"],
            "partial": metrics["partial"],
            "loss_curves": dg.MetadataValue.md(
                f"![loss curves](data:image/png;base64,{png})\n\n"
                f"validation loss **{metrics['validation_loss']:.4f}** vs unigram baseline "
                f"**{metrics['unigram_baseline_loss']:.4f}** nats/token"
            ),
        },
        headline={
            **quality_headline(metrics, tokens_per_byte(artifact, store)),
            "training": dg.MetadataValue.md(training),
        },
    )


def pipes_launcher(context: dg.AssetExecutionContext) -> Callable[[Sequence[str], Mapping[str, str]], None]:
    """How a training.processes > 1 run starts torchrun: through Dagster Pipes, so rank 0's log
    lines (progress, loss, tokens/s) arrive in this run's logs as they happen. On Kubernetes the
    same command runs in a pod of its own with dg.PipesK8sClient (docs/operations/scaling-out.md)."""

    def launch(command: Sequence[str], env: Mapping[str, str]) -> None:
        dg.PipesSubprocessClient().run(command=list(command), context=context, env=dict(env))

    return launch


def quality_headline(metrics: dict, ratio: float | None) -> dict:
    """The model's quality first on its page, in nats per token and (with the validation text's
    tokens per byte) in bits per byte, the unit the gate decides in: numbers the UI plots."""
    headline = {}
    for name in ("validation", "unigram_baseline"):
        headline[f"{name}_loss"] = metrics[f"{name}_loss"]
        if ratio is not None:
            headline[f"{name}_bits_per_byte"] = bits_per_byte(metrics[f"{name}_loss"], ratio)
    return headline


@dg.asset_check(asset=model_checkpoint, blocking=True, description="Every weight is finite: no NaN or inf.")
def weights_finite(aieng: AiengResource) -> dg.AssetCheckResult:
    from aieng_core.model.hf_files import non_finite_tensors  # torch: imported only when a model check runs

    artifact = aieng.store().require_current(model_checkpoint.key.to_user_string())
    bad = non_finite_tensors(artifact)
    return dg.AssetCheckResult(passed=not bad, metadata={"non_finite_tensors": ", ".join(bad) or "none"})


@dg.asset_check(asset=model_checkpoint, blocking=True, description="Validation loss is below the unigram baseline.")
def beats_unigram_baseline(aieng: AiengResource) -> dg.AssetCheckResult:
    metrics = aieng.store().require_current(model_checkpoint.key.to_user_string()).metrics
    return dg.AssetCheckResult(
        passed=metrics["validation_loss"] < metrics["unigram_baseline_loss"],
        metadata={
            "validation_loss": metrics["validation_loss"],
            "unigram_baseline_loss": metrics["unigram_baseline_loss"],
        },
    )


@dg.asset_check(
    asset=model_checkpoint, blocking=True, description="The weights hold exactly the parameters the config implies."
)
def parameter_count_matches_config(aieng: AiengResource) -> dg.AssetCheckResult:
    from aieng_core.model.hf_files import checkpoint_config, stored_parameters
    from aieng_core.model.llama import expected_parameters

    artifact = aieng.store().require_current(model_checkpoint.key.to_user_string())
    stored, expected = stored_parameters(artifact), expected_parameters(checkpoint_config(artifact))
    return dg.AssetCheckResult(passed=stored == expected, metadata={"stored": stored, "expected_from_config": expected})


CHECKS = [weights_finite, beats_unigram_baseline, parameter_count_matches_config]
