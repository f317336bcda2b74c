"""The Lambda Invoke API, served by a real handler running in this process.

moto's Lambda does not run code without Docker, so the producer client and the
dead-letter resubmission are tested against this stand-in: it calls the real function
handler (``tests.functions.conftest.load_app``; it talks to the test's real PostgreSQL) and
answers exactly as Lambda's Invoke does: HTTP 200 with the handler's JSON, or HTTP 200
with ``FunctionError: Unhandled`` and Lambda's error document when the handler raised;
HTTP 202 and nothing run yet for ``InvocationType=Event``.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from tests.support.fakes import FakeLambdaContext


@dataclass
class InProcessLambda:
    app: ModuleType
    function_name: str = "leaseq-test-EnqueueFunction"
    calls: list[dict[str, Any]] = field(default_factory=list)
    queued: list[Any] = field(default_factory=list)

    def invoke(self, *, FunctionName: str, Payload: bytes,
               InvocationType: str = "RequestResponse") -> dict[str, Any]:
        assert FunctionName in (self.function_name, self.arn), FunctionName
        event = json.loads(Payload)
        self.calls.append({"type": InvocationType, "event": event})
        if InvocationType == "Event":
            self.queued.append(event)
            return {"StatusCode": 202, "Payload": io.BytesIO(b"")}
        context = FakeLambdaContext(function_name=self.function_name,
                                    invoked_function_arn=self.arn)
        try:
            answer = self.app.lambda_handler(event, context)
        except Exception as exc:
            document = {"errorMessage": str(exc), "errorType": type(exc).__name__,
                        "requestId": context.aws_request_id, "stackTrace": []}
            return {"StatusCode": 200, "FunctionError": "Unhandled",
                    "Payload": io.BytesIO(json.dumps(document).encode())}
        return {"StatusCode": 200, "Payload": io.BytesIO(json.dumps(answer).encode())}

    @property
    def arn(self) -> str:
        return f"arn:aws:lambda:us-east-1:123456789012:function:{self.function_name}"
