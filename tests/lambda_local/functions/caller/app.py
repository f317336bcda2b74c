"""A test function that invokes another function through leaseq_lambda.invoker.

Event: ``{"target": NAME, "payload": {...}, "type": "RequestResponse" | "Event"}``.
"""

from __future__ import annotations

import json
from typing import Any

from leaseq_lambda.invoker import lambda_client


def lambda_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    client = lambda_client()
    answer = client.invoke(FunctionName=event["target"],
                           InvocationType=event.get("type", "RequestResponse"),
                           Payload=json.dumps(event.get("payload", {})))
    body = answer["Payload"].read()
    return {"endpoint": client.meta.endpoint_url, "status": answer["StatusCode"],
            "function_error": answer.get("FunctionError"),
            "payload": json.loads(body) if body else None}
