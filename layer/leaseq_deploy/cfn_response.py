"""Answer a CloudFormation custom-resource request, exactly once.

CloudFormation waits for one PUT of a JSON document to the presigned ``ResponseURL`` (an S3
URL). Without it the stack hangs until the resource's ServiceTimeout, so every path of the
handler ends here: success, failure, Delete, and a watchdog that answers before Lambda's
own timeout would end the process silently. Only the standard library is used, so the
answer can still be sent when the layer itself failed to import.

Why not crhelper (2.0.12, the maintained helper for this protocol), read for this module:

* its watchdog and the handler's own answer are not serialised: a handler that finishes
  while the timer fires sends both SUCCESS and FAILED, and CloudFormation takes whichever
  arrives first; here a lock makes the first answer the only one;
* the watchdog fires 0.5 s before Lambda's timeout, too little for a PUT to S3 through a
  VPC endpoint on a slow start; here it is WATCHDOG_MARGIN_SECONDS (10 s) in function.py;
* a PUT that keeps failing is retried for ever (five tries, a pause, and again), so the
  function hangs until Lambda kills it; here three tries, then the failure is logged;
* it reconfigures the root logger and creates Lambda, EventBridge and CloudWatch Logs
  clients at import for its polling mode, which this resource does not use;
* it speaks HTTPS only, so its answers cannot be checked against the loopback server
  the tests stand in for the presigned URL with.

The behaviours the tests hold this module to: one answer per request, from whichever path
is first; no secret in it (Data carries versions and login names, never a password); the
failure's reason, cut to CloudFormation's 4096-byte body limit; the physical id of the
request kept on Update and Delete (app.physical_resource_id).
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any, Final

SUCCESS: Final = "SUCCESS"
FAILED: Final = "FAILED"

#: CloudFormation rejects response bodies over 4096 bytes; a long reason is cut to fit.
MAX_BODY_BYTES: Final = 4096
_PUT_ATTEMPTS: Final = 3

logger = logging.getLogger("leaseq.migrations")

#: Sends one request and returns the HTTP status; injectable so tests can break the network.
Opener = Callable[[urllib.request.Request, float], int]


def _urlopen(request: urllib.request.Request, timeout: float) -> int:
    with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310
        return int(response.status)


def response_body(
    event: Mapping[str, Any],
    status: str,
    *,
    reason: str,
    physical_resource_id: str,
    data: Mapping[str, str] | None = None,
) -> bytes:
    """The JSON document CloudFormation expects, cut to its size limit."""
    document: dict[str, Any] = {
        "Status": status,
        "Reason": reason,
        "PhysicalResourceId": physical_resource_id,
        "StackId": event["StackId"],
        "RequestId": event["RequestId"],
        "LogicalResourceId": event["LogicalResourceId"],
        "NoEcho": False,
        "Data": dict(data or {}),
    }
    body = json.dumps(document).encode("utf-8")
    overflow = len(body) - MAX_BODY_BYTES
    if overflow > 0:
        keep = max(0, len(reason) - overflow - 16)
        document["Reason"] = reason[:keep] + " [truncated]"
        body = json.dumps(document).encode("utf-8")
    return body


def put(url: str, body: bytes, *, opener: Opener = _urlopen, timeout: float = 10.0) -> bool:
    """PUT the body, retrying briefly; True when the endpoint accepted it."""
    # The presigned URL is signed without a content type, so send an empty one (urllib
    # would otherwise add application/x-www-form-urlencoded and break the signature).
    request = urllib.request.Request(  # noqa: S310
        url,
        data=body,
        method="PUT",
        headers={"Content-Type": "", "Content-Length": str(len(body))},
    )
    for attempt in range(1, _PUT_ATTEMPTS + 1):
        try:
            status = opener(request, timeout)
        except OSError as exc:
            logger.warning("response PUT attempt %d failed: %s", attempt, exc)
        else:
            if 200 <= status < 300:
                return True
            logger.warning("response PUT attempt %d got HTTP %d", attempt, status)
        if attempt < _PUT_ATTEMPTS:
            time.sleep(0.5 * attempt)
    return False


class Responder:
    """Sends the answer to one request at most once, from whichever thread is first."""

    def __init__(self, event: Mapping[str, Any], *, opener: Opener = _urlopen) -> None:
        self._event = event
        self._opener = opener
        self._lock = threading.Lock()
        self._sent: str | None = None

    @property
    def sent_status(self) -> str | None:
        return self._sent

    def send(
        self,
        status: str,
        *,
        reason: str,
        physical_resource_id: str,
        data: Mapping[str, str] | None = None,
    ) -> bool:
        """Answer unless already answered; False when this call did not send."""
        with self._lock:
            if self._sent is not None:
                logger.info("already answered %s; dropping %s", self._sent, status)
                return False
            self._sent = status
        body = response_body(
            self._event,
            status,
            reason=reason,
            physical_resource_id=physical_resource_id,
            data=data,
        )
        delivered = put(str(self._event["ResponseURL"]), body, opener=self._opener)
        if delivered:
            logger.info("answered CloudFormation: %s (%s)", status, reason)
        else:
            logger.error("could not deliver %s to CloudFormation; the stack will wait", status)
        return delivered
