"""model_checkpoint: the language model, trained from scratch."""

import base64

import dagster as dg

from aieng_core.training import model_checkpoint as checkpoint
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
    artifact = checkpoint.build_model_checkpoint(aieng.store(), aieng.settings(), run_info(context), context.log)
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
            "training": dg.MetadataValue.md(training),
            "loss_curves": dg.MetadataValue.md(
                f"![loss curves](data:image/png;base64,{png})\n\n"
                f"validation loss **{metrics['validation_loss']:.4f}** vs unigram baseline "
                f"**{metrics['unigram_baseline_loss']:.4f}** nats/token"
            ),
        },
    )
