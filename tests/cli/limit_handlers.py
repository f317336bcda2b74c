"""Handlers that declare limits, for ``leaseq limits sync``."""

from __future__ import annotations

from typing import Any

from leaseq import JobContext, Registry

registry = Registry()


@registry.handler("build_report", concurrency=2, per_tenant=True)
def build_report(payload: dict[str, Any], ctx: JobContext) -> None:
    """Two reports at once per customer."""


@registry.handler("call_partner", rate="10/s", burst=2)
def call_partner(payload: dict[str, Any], ctx: JobContext) -> None:
    """A partner API that allows ten calls a second."""
