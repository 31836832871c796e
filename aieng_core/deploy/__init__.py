"""Deployment state: which serving bundle each pointer serves now, and how it got there."""

from aieng_core.deploy.deployments import (
    DEFAULT_POINTER,
    DeploymentError,
    Deployments,
    DeploymentStateError,
)

__all__ = ["DEFAULT_POINTER", "DeploymentError", "DeploymentStateError", "Deployments"]
