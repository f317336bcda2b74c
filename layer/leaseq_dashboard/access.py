"""Who is looking, and what they may do.

In AWS the dashboard is a Lambda function URL with ``AWS_IAM`` auth: Lambda has already
checked the request's SigV4 signature, and the caller's IAM principal is in the request
context (``requestContext.authorizer.iam.userArn``). That identity is only as good as
the event: it is the function URL's only because nobody may invoke the function
directly (``lambda:InvokedViaFunctionUrl``, see :mod:`leaseq_dashboard.origin`). Being
allowed to invoke the URL is not enough to see anything: the principal must also match
one of the patterns of an :class:`AccessPolicy`, which gives it one of three roles:

``operator``  every tenant, and the actions (redrive, cancel);
``viewer``    every tenant, read only;
``tenant``    one tenant, read only, through that tenant's own reader login, so
              row-level security does the filtering, not this code.

Patterns take ``*`` and ``?`` within one segment of the ARN (never across ``/``; see
:mod:`leaseq_dashboard.patterns`, which also says which patterns are safe): an assumed
role's sessions are ``arn:aws:sts::123456789012:assumed-role/OnCall/*``. The first role
that matches, in the order above, wins; a principal matching none is refused (403).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal
from uuid import UUID

from leaseq_dashboard.patterns import matches

Role = Literal["operator", "viewer", "tenant"]

#: The longest actor an audit event accepts (app.check_owner).
MAX_ACTOR = 200


@dataclass(frozen=True)
class Viewer:
    """An identified caller and the role the policy gave it."""

    principal: str
    role: Role
    tenant_id: UUID | None = None

    @property
    def may_act(self) -> bool:
        """Only operators redrive and cancel."""
        return self.role == "operator"

    @property
    def actor(self) -> str:
        """The audit events' actor: the IAM principal, marked as coming from here."""
        return f"dashboard:{self.principal}"[:MAX_ACTOR]


class AccessDeniedError(Exception):
    """The caller is not identified, or no pattern of the policy names it."""


@dataclass(frozen=True)
class AccessPolicy:
    """Principal patterns per role (see the module docstring)."""

    operators: Sequence[str] = ()
    viewers: Sequence[str] = ()
    tenant_viewers: Mapping[str, UUID] = field(default_factory=dict)

    def viewer(self, principal: str | None) -> Viewer:
        """The :class:`Viewer` for ``principal``, or :class:`AccessDeniedError`."""
        if not principal:
            raise AccessDeniedError(
                "the request carries no IAM principal: the function URL must use AWS_IAM "
                "auth (or run locally with leaseq dashboard)")
        if any(matches(p, principal) for p in self.operators):
            return Viewer(principal, "operator")
        if any(matches(p, principal) for p in self.viewers):
            return Viewer(principal, "viewer")
        for pattern, tenant in self.tenant_viewers.items():
            if matches(pattern, principal):
                return Viewer(principal, "tenant", tenant)
        raise AccessDeniedError(
            f"{principal} may not use this dashboard: add it to DashboardOperators, "
            "DashboardViewers or DashboardTenantViewers")


def principal_of(event: Mapping[str, Any]) -> str | None:
    """The IAM principal ARN of a function URL (or HTTP API v2) event, if any, read
    without checking the event's shape (the local server makes its own events; the
    deployed dashboard uses :meth:`leaseq_dashboard.origin.FunctionUrlOrigin.principal`)."""
    context = event.get("requestContext") or {}
    authorizer = context.get("authorizer") or {}
    iam = authorizer.get("iam") or {}
    arn = iam.get("userArn")
    return str(arn) if arn else None
