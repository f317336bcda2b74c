"""The scheduled worker function (``Handler: app.lambda_handler``): its code is
:mod:`leaseq_lambda.handlers.worker`, which the layer carries."""

from leaseq_lambda.handlers.worker import lambda_handler

__all__ = ["lambda_handler"]
