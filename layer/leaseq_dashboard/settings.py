"""The dashboard's settings, from ``LEASEQ_DASHBOARD_*`` variables (read at the edge).

The access policy (who is an operator, a viewer, or a tenant's viewer) and how the
tenant reader connection logs in. The operator connection is the one every leaseq
function uses (``DATABASE_URL``, ``LEASEQ_DATABASE_SECRET_ARN`` or IAM auth, see
``leaseq_lambda.runtime``): a member of leaseq_operator.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from leaseq_dashboard.access import AccessPolicy


def _patterns(value: Any) -> Any:
    if isinstance(value, str):
        return [p.strip() for p in value.split(",") if p.strip()]
    return value


class DashboardSettings(BaseModel):
    """Access patterns per role and the tenant reader's login (see access.py)."""

    model_config = ConfigDict(frozen=True, populate_by_name=True, extra="ignore")

    operators: list[str] = Field(default_factory=list, alias="LEASEQ_DASHBOARD_OPERATORS",
                                 description="comma-separated principal patterns")
    viewers: list[str] = Field(default_factory=list, alias="LEASEQ_DASHBOARD_VIEWERS",
                               description="comma-separated principal patterns, read only")
    tenant_viewers: dict[str, UUID] = Field(
        default_factory=dict, alias="LEASEQ_DASHBOARD_TENANT_VIEWERS",
        description='JSON object {"principal pattern": "tenant uuid"}')
    reader_url: SecretStr | None = Field(
        default=None, alias="LEASEQ_DASHBOARD_READER_URL",
        description="DSN of the tenant reader role (a member of authenticated)")
    reader_secret_arn: str | None = Field(
        default=None, alias="LEASEQ_DASHBOARD_READER_SECRET_ARN",
        description="or: a Secrets Manager secret with the tenant reader's login")
    reader_user: str | None = Field(
        default=None, alias="LEASEQ_DASHBOARD_READER_USER",
        description="or, with LEASEQ_DB_IAM_AUTH: the tenant reader's user name")

    _split_operators = field_validator("operators", "viewers", mode="before")(
        staticmethod(_patterns))

    @field_validator("tenant_viewers", mode="before")
    @classmethod
    def _json_object(cls, value: Any) -> Any:
        if isinstance(value, str):
            return json.loads(value) if value.strip() else {}
        return value

    @property
    def policy(self) -> AccessPolicy:
        """The :class:`AccessPolicy` these settings describe."""
        return AccessPolicy(tuple(self.operators), tuple(self.viewers),
                            dict(self.tenant_viewers))

    @property
    def has_tenant_viewers(self) -> bool:
        """Whether a tenant reader connection is needed at all."""
        return bool(self.tenant_viewers)

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> DashboardSettings:
        """Validate the ``LEASEQ_DASHBOARD_*`` variables of ``environ``."""
        aliases = {f.alias for f in cls.model_fields.values() if f.alias}
        return cls.model_validate({k: v for k, v in environ.items()
                                   if k in aliases and v != ""})
