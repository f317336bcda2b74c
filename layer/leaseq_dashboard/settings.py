"""The dashboard's settings, from ``LEASEQ_DASHBOARD_*`` variables (read at the edge).

The access policy (who is an operator, a viewer, or a tenant's viewer), how many tenant
reader connections one execution environment keeps, and the function URL the requests
must come through. The dashboard's own connection is the one every leaseq function
uses (``DATABASE_URL``, ``LEASEQ_DATABASE_SECRET_ARN`` or IAM auth, see
``leaseq_lambda.runtime``): a member of leaseq_dashboard. A tenant viewer is served
over that tenant's own reader login (:func:`leaseq_dashboard.sources.reader_login`) on
the same server and database.

Every principal pattern is checked here (:func:`leaseq_dashboard.patterns.check_pattern`),
so an unsafe one fails the cold start instead of going live.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field, field_validator

from leaseq_dashboard.access import AccessPolicy
from leaseq_dashboard.patterns import check_pattern


def _patterns(value: Any) -> Any:
    if isinstance(value, str):
        return [p.strip() for p in value.split(",") if p.strip()]
    return value


class DashboardSettings(BaseModel):
    """Access patterns per role, the tenant readers' connections and the function URL."""

    model_config = ConfigDict(frozen=True, populate_by_name=True, extra="ignore")

    operators: list[str] = Field(default_factory=list, alias="LEASEQ_DASHBOARD_OPERATORS",
                                 description="comma-separated principal patterns")
    viewers: list[str] = Field(default_factory=list, alias="LEASEQ_DASHBOARD_VIEWERS",
                               description="comma-separated principal patterns, read only")
    tenant_viewers: dict[str, UUID] = Field(
        default_factory=dict, alias="LEASEQ_DASHBOARD_TENANT_VIEWERS",
        description='JSON object {"principal pattern": "tenant uuid"}')
    reader_connections: int = Field(
        default=1, ge=1, le=20, alias="LEASEQ_DASHBOARD_READER_CONNECTIONS",
        description="most tenant reader connections one execution environment keeps open")
    url_id: str | None = Field(
        default=None, pattern=r"^[a-z0-9]{1,63}$", alias="LEASEQ_DASHBOARD_URL_ID",
        description="the function URL's id (its host's first label), when known")

    _split_operators = field_validator("operators", "viewers", mode="before")(
        staticmethod(_patterns))

    @field_validator("tenant_viewers", mode="before")
    @classmethod
    def _json_object(cls, value: Any) -> Any:
        if isinstance(value, str):
            return json.loads(value) if value.strip() else {}
        return value

    @field_validator("operators", "viewers")
    @classmethod
    def _safe_patterns(cls, value: list[str]) -> list[str]:
        return [check_pattern(pattern) for pattern in value]

    @field_validator("tenant_viewers")
    @classmethod
    def _safe_tenant_patterns(cls, value: dict[str, UUID]) -> dict[str, UUID]:
        for pattern in value:
            check_pattern(pattern)
        return value

    @property
    def policy(self) -> AccessPolicy:
        """The :class:`AccessPolicy` these settings describe."""
        return AccessPolicy(tuple(self.operators), tuple(self.viewers),
                            dict(self.tenant_viewers))

    @property
    def has_tenant_viewers(self) -> bool:
        """Whether tenant reader connections are needed at all."""
        return bool(self.tenant_viewers)

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> DashboardSettings:
        """Validate the ``LEASEQ_DASHBOARD_*`` variables of ``environ``."""
        aliases = {f.alias for f in cls.model_fields.values() if f.alias}
        return cls.model_validate({k: v for k, v in environ.items()
                                   if k in aliases and v != ""})
