"""The dashboard behind a Lambda function URL (AWS_IAM auth): one resolver for every page."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext
from leaseq_dashboard import handle, runtime
from leaseq_lambda import telemetry

logger = telemetry.make_logger()


@logger.inject_lambda_context(clear_state=True)
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    """Resolve the request; the caller's IAM principal decides what it may see and do."""
    dashboard = runtime.get()
    response = handle(dashboard.app, event, context)
    http = (event.get("requestContext") or {}).get("http") or {}
    logger.info("dashboard request", extra={
        "method": http.get("method"), "path": event.get("rawPath"),
        "status": response.get("statusCode"),
        "principal": (((event.get("requestContext") or {}).get("authorizer") or {})
                      .get("iam") or {}).get("userArn")})
    return response
