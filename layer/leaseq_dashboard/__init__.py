"""leaseq's web dashboard: queue depth, stuck jobs, a job's timeline, redrive and cancel.

One Powertools ``LambdaFunctionUrlResolver`` (:func:`leaseq_dashboard.app.build`) serves
both the Lambda function URL (:mod:`leaseq_dashboard.function`, ``AWS_IAM`` auth) and the
local command ``leaseq dashboard`` (:mod:`leaseq_dashboard.local`, which turns local HTTP
requests into the same function URL events). Pages read through
:mod:`leaseq.read.views`: no SQL lives here.
"""

from leaseq_dashboard.access import AccessDeniedError, AccessPolicy, Viewer
from leaseq_dashboard.app import ViewSource, build, handle
from leaseq_dashboard.settings import DashboardSettings

__all__ = [
    "AccessDeniedError",
    "AccessPolicy",
    "DashboardSettings",
    "ViewSource",
    "Viewer",
    "build",
    "handle",
]
