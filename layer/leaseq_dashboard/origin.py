"""Whether an event has the shape of a request through this function's URL.

The barrier is IAM, not this module. A function URL with ``AWS_IAM`` auth needs the
caller to hold ``lambda:InvokeFunctionUrl`` and ``lambda:InvokeFunction``; the template
documents the second only with the condition ``lambda:InvokedViaFunctionUrl = true``,
so nobody it describes can call ``lambda:Invoke`` on the dashboard directly. Whoever
can (an administrator, a role with ``lambda:*``) can send *any* event, with any
``userArn``, in exactly the shape checked here: the check cannot tell a forged event
from a real one.

What it does catch: an event from something other than the URL (a test console, an
event source mapping, a schedule pointed at the wrong function, a copy of an old event
from a log), an event for another function's URL or another region, and identities that
do not hold together (an access key without a user, a ``userArn`` of another account
than ``accountId``). Those are refused before any page runs, with no identity read from
them. Defence in depth, nothing more: docs/dashboard.md says what must not be granted.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from leaseq_dashboard.access import AccessDeniedError

_URL_ID = re.compile(r"^[a-z0-9]{1,63}$")
_PRINCIPAL = re.compile(r"^arn:aws[a-z-]*:(iam|sts)::(?P<account>[0-9]{12}):[^\s]+$")
_ACCESS_KEY = re.compile(r"^[A-Z0-9]{4,128}$")
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


class NotAFunctionUrlRequestError(AccessDeniedError):
    """The event does not have the shape of a request through this function's URL
    (answered 403, like any other refusal)."""


def _text(value: Any) -> bool:
    return isinstance(value, str) and bool(value)


@dataclass(frozen=True)
class FunctionUrlOrigin:
    """The function URL requests must come through: its region (``AWS_REGION``) and, when
    known (``LEASEQ_DASHBOARD_URL_ID``), the URL's id, the first label of its host."""

    region: str
    url_id: str | None = None

    @property
    def domain_suffix(self) -> str:
        """What every function URL host of this region ends with."""
        return f".lambda-url.{self.region}.on.aws"

    def problem(self, event: Any) -> str | None:
        """Why ``event`` is not a function URL request (payload 2.0) of this function, or
        None when its shape holds together."""
        if not isinstance(event, Mapping):
            return "the event is not a JSON object"
        if event.get("version") != "2.0" or event.get("routeKey") != "$default":
            return "not a function URL event (payload version 2.0, route $default)"
        raw_path = event.get("rawPath")
        if not isinstance(raw_path, str) or not raw_path.startswith("/"):
            return "rawPath is not an absolute path"
        headers = event.get("headers")
        if not isinstance(headers, Mapping) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in headers.items()):
            return "headers are not a map of strings"
        if not isinstance(event.get("isBase64Encoded"), bool):
            return "isBase64Encoded is not a boolean"
        context = event.get("requestContext")
        if not isinstance(context, Mapping):
            return "the event has no requestContext"
        return self._context_problem(context, raw_path, headers)

    def _context_problem(self, context: Mapping[str, Any], raw_path: str,
                         headers: Mapping[str, str]) -> str | None:
        http = context.get("http")
        if not isinstance(http, Mapping) or http.get("method") not in _METHODS \
                or http.get("path") != raw_path or not _text(http.get("sourceIp")):
            return "requestContext.http has no method, path (= rawPath) and sourceIp"
        if not _text(context.get("requestId")) or not isinstance(context.get("timeEpoch"),
                                                                  int):
            return "requestContext has no requestId and timeEpoch"
        url_id = context.get("apiId")
        if not isinstance(url_id, str) or not _URL_ID.match(url_id):
            return "requestContext.apiId is not a function URL id"
        domain = f"{url_id}{self.domain_suffix}"
        if context.get("domainName") != domain or context.get("domainPrefix") != url_id:
            return (f"the request is not for a function URL of {self.region} "
                    f"(domainName {context.get('domainName')!r})")
        if self.url_id is not None and url_id != self.url_id:
            return f"the request is for function URL {url_id}, not this one ({self.url_id})"
        host = headers.get("host")
        if host is not None and host != domain:
            return f"the Host header {host!r} is not the function URL's {domain!r}"
        return self._identity_problem(context.get("authorizer"))

    @staticmethod
    def _identity_problem(authorizer: Any) -> str | None:
        if not isinstance(authorizer, Mapping) or set(authorizer) != {"iam"} \
                or not isinstance(authorizer["iam"], Mapping):
            return ("the request carries no IAM identity: the function URL must use AWS_IAM "
                    "auth")
        iam = authorizer["iam"]
        arn = iam.get("userArn")
        found = _PRINCIPAL.match(arn) if isinstance(arn, str) else None
        if found is None:
            return "authorizer.iam.userArn is not an IAM or STS principal ARN"
        if iam.get("accountId") != found["account"]:
            return "authorizer.iam.accountId is not the account of its userArn"
        access_key = iam.get("accessKey")
        if not isinstance(access_key, str) or not _ACCESS_KEY.match(access_key) \
                or not _text(iam.get("userId")):
            return "authorizer.iam has no accessKey and userId"
        return None

    def principal(self, event: Any) -> str:
        """The caller's IAM principal ARN, or :class:`NotAFunctionUrlRequestError`."""
        problem = self.problem(event)
        if problem is not None:
            raise NotAFunctionUrlRequestError(problem)
        return str(event["requestContext"]["authorizer"]["iam"]["userArn"])
