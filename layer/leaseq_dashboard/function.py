"""The dashboard behind a Lambda function URL (AWS_IAM auth): one resolver for every page.

An event without the function URL's shape (a direct Invoke, a test event) is refused
before anything reads an identity from it; that check is defence in depth, the barrier
is that nobody may invoke the function except through its URL (docs/dashboard.md).
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext
from leaseq_lambda import telemetry

from leaseq_dashboard import handle, runtime
from leaseq_dashboard.app import SECURITY_HEADERS

logger = telemetry.make_logger()


def _refused(reason: str) -> dict[str, Any]:
    return {"statusCode": 403,
            "headers": {**SECURITY_HEADERS, "Content-Type": "text/plain; charset=utf-8"},
            "body": f"refused: {reason}", "isBase64Encoded": False}


@logger.inject_lambda_context(clear_state=True)
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    """Resolve the request; the caller's IAM principal decides what it may see and do."""
    dashboard = runtime.get()
    problem = dashboard.origin.problem(event)
    if problem is not None:
        logger.warning("dashboard event refused: not a function URL request",
                       extra={"reason": problem})
        return _refused(problem)
    response = handle(dashboard.app, event, context)
    logger.info("dashboard request", extra={
        "method": event["requestContext"]["http"]["method"], "path": event["rawPath"],
        "status": response.get("statusCode"),
        "principal": dashboard.origin.principal(event)})
    return response
