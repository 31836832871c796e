"""Deployment policy: promote a serving bundle that verifies and was not withdrawn, roll back
to one that verifies. The pointer files themselves are store/pointers.py's."""

from aieng_core.deploy.deployments import (
    BundleWithdrawn,
    DeploymentError,
    Deployments,
    DeploymentStateError,
)

__all__ = ["BundleWithdrawn", "DeploymentError", "DeploymentStateError", "Deployments"]
