"""The dashboard's part of the logins: its tenant viewers' reader logins, and its access
patterns checked before anything is deployed.

``DashboardTenantViewers`` (JSON ``{"principal pattern": "tenant uuid"}``) names the
tenants whose viewers the dashboard serves. Each of those tenants gets a reader login of
its own, named after it (``leaseq_dashboard.sources.reader_login``), a member of
``authenticated`` bound to that tenant only: the database, not the page, keeps one
tenant viewer from another. They authenticate with IAM alone (the dashboard's role may
``rds-db:connect`` as ``leaseq_tenant_reader_*`` on this database and nothing else of
the kind), so tenant viewers with password authentication are refused here, with the
parameter to change, as the template's rule refuses them.

The patterns of ``DashboardOperators``, ``DashboardViewers`` and the keys of
``DashboardTenantViewers`` are checked with the dashboard's own rules
(``leaseq_dashboard.patterns``), so an unsafe pattern fails the deploy instead of the
dashboard's first request. A request without these properties comes from an earlier
template (CloudFormation rolling back): nothing is checked and no reader binding is
touched.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any
from uuid import UUID

from leaseq.base.errors import ConfigurationError

TENANT_VIEWERS = "DashboardTenantViewers"
PATTERN_LISTS = ("DashboardOperators", "DashboardViewers")


def manages_tenant_readers(properties: Mapping[str, Any]) -> bool:
    """Whether the request speaks for the reader logins (an earlier template did not)."""
    return TENANT_VIEWERS in properties


def tenant_viewers(properties: Mapping[str, Any]) -> dict[str, UUID]:
    """The property's patterns and tenants; {} when empty or absent."""
    text = str(properties.get(TENANT_VIEWERS) or "").strip()
    if not text:
        return {}
    try:
        value = json.loads(text)
        if not isinstance(value, dict):
            raise TypeError("not an object")
        return {str(pattern): UUID(str(tenant)) for pattern, tenant in value.items()}
    except (ValueError, TypeError) as exc:
        raise ConfigurationError(
            f"{TENANT_VIEWERS} must be a JSON object of principal patterns to tenant "
            f"UUIDs, as {{\"arn:aws:sts::123456789012:assumed-role/AcmeSupport/*\": "
            f"\"<tenant uuid>\"}} ({exc})") from None


def check_access_patterns(properties: Mapping[str, Any]) -> None:
    """Refuse an unsafe principal pattern, naming the parameter it came from."""
    from leaseq_dashboard.patterns import pattern_problem

    named = [(name, pattern.strip()) for name in PATTERN_LISTS
             for pattern in str(properties.get(name) or "").split(",") if pattern.strip()]
    named += [(TENANT_VIEWERS, pattern) for pattern in tenant_viewers(properties)]
    for parameter, pattern in named:
        problem = pattern_problem(pattern)
        if problem is not None:
            raise ConfigurationError(f"{parameter}: principal pattern {pattern!r}: {problem}")


def tenant_reader_specs(properties: Mapping[str, Any], *, iam_auth: bool,
                        statement_timeout: str) -> list[Any]:
    """One reader login spec per tenant the tenant viewers name, in a stable order."""
    from leaseq_dashboard.sources import reader_login

    from leaseq_deploy.runtime_role import READER_GROUP, LoginRoleSpec

    tenants = sorted(set(tenant_viewers(properties).values()), key=str)
    if tenants and not iam_auth:
        raise ConfigurationError(
            f"{TENANT_VIEWERS} needs IAM authentication: each tenant's reader login logs "
            "in with an RDS IAM token and there is no secret per tenant. With password "
            f"authentication leave {TENANT_VIEWERS} empty (viewers of every tenant, "
            "DashboardViewers, need no reader login)")
    return [LoginRoleSpec(name=reader_login(tenant), group=READER_GROUP, iam_auth=True,
                          statement_timeout=statement_timeout, tenant=tenant,
                          parameter=f"{TENANT_VIEWERS} (tenant {tenant})")
            for tenant in tenants]
