"""aieng core library: every capability of the pipeline, callable without Dagster."""

__version__ = "0.1.0"
