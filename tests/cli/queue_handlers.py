"""A handlers module whose kind is declared with a named queue, for the command line's
tests of ``leaseq enqueue --handlers``."""

from __future__ import annotations

from typing import Any

from leaseq import JobContext, Registry

registry = Registry()


@registry.handler("report.build", queue="reports")
def build_report(payload: dict[str, Any], ctx: JobContext) -> None:
    """Builds nothing: the tests only enqueue it."""
