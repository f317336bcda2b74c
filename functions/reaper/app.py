"""The scheduled reaper function (``Handler: app.lambda_handler``): its code is
:mod:`leaseq_lambda.handlers.reaper`, which the layer carries."""

from leaseq_lambda.handlers.reaper import lambda_handler

__all__ = ["lambda_handler"]
