"""The job handlers of a team's own project: what HandlersModule (LEASEQ_HANDLERS) names.

The worker imports this module from the handlers layer and reads its ``registry``. It
uses a package of its own (humanize, from requirements.txt, in the same layer) and its
settings from the stack's HandlersEnvironment parameter.
"""

from __future__ import annotations

from typing import Any

import humanize
from leaseq import DiscardJob, JobContext, Registry, RetryPolicy
from leaseq_lambda import handlers_environment
from pydantic import BaseModel, ConfigDict, Field

registry = Registry()

#: Read once, when the worker imports the module: a bad setting stops it at start.
SETTINGS = handlers_environment()
CURRENCY = SETTINGS.get("CURRENCY", "EUR")


class Invoice(BaseModel):
    """The payload of an invoice.render job; a payload that does not fit makes it dead."""

    model_config = ConfigDict(extra="forbid")

    customer: str = Field(min_length=1, max_length=64)
    amount_cents: int = Field(gt=0)


@registry.handler("invoice.render", payload=Invoice, timeout=10,
                  retry=RetryPolicy(base_delay=2, max_delay=120))
def render_invoice(payload: Invoice, ctx: JobContext) -> dict[str, Any]:
    # At-least-once: the invoice number comes from the job, so a rerun renders the same one.
    number = f"INV-{str(ctx.job.id)[:8].upper()}"
    amount = humanize.intcomma(payload.amount_cents // 100)
    return {"invoice": number, "text": f"{payload.customer} owes {amount} {CURRENCY}"}


@registry.handler("report.monthly", timeout=600)
def monthly_report(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    # A slow kind: SlowKinds (the example's template) gives it a worker with a longer timeout.
    month = payload.get("month")
    if not isinstance(month, str):
        raise DiscardJob("payload.month must be a string such as 2026-11")
    return {"month": month, "rows": 0}
