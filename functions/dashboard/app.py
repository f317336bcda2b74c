"""The dashboard function (``Handler: app.lambda_handler``): its code is
:mod:`leaseq_dashboard.function`, which the layer carries."""

from leaseq_dashboard.function import lambda_handler

__all__ = ["lambda_handler"]
