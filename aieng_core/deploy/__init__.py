"""Deployment policy: promote a serving bundle that verifies, roll back to one that exists.
The pointer files themselves are store/pointers.py's."""

from aieng_core.deploy.deployments import (
    DeploymentError,
    Deployments,
    DeploymentStateError,
)

__all__ = ["DeploymentError", "DeploymentStateError", "Deployments"]
