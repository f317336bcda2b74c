"""The migrations custom resource (``Handler: app.lambda_handler``): its code is
:mod:`leaseq_deploy.function`, which the layer carries."""

from leaseq_deploy.function import lambda_handler

__all__ = ["lambda_handler"]
