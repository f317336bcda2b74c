"""The enqueue function (``Handler: app.lambda_handler``): its code is
:mod:`leaseq_lambda.handlers.enqueue`, which the layer carries."""

from leaseq_lambda.handlers.enqueue import lambda_handler

__all__ = ["lambda_handler"]
