"""An example handlers module: what LEASEQ_HANDLERS names in a deployed worker.

The worker imports the module and reads its module-level ``registry``. Run it locally:

    leaseq enqueue --file examples/jobs.jsonl
    leaseq drain --handlers examples.handlers
"""

from __future__ import annotations

from typing import Any

from leaseq import DiscardJob, JobContext, Registry, RetryPolicy
from pydantic import BaseModel, ConfigDict, Field

registry = Registry()


class InvoiceRequest(BaseModel):
    """A payload model: a payload that does not fit makes the job dead at once."""

    model_config = ConfigDict(extra="forbid")

    customer_id: str = Field(min_length=1, max_length=64)
    amount_cents: int = Field(gt=0)
    currency: str = Field(default="EUR", pattern="^[A-Z]{3}$")


@registry.handler("invoice.create", payload=InvoiceRequest, timeout=10,
                  retry=RetryPolicy(base_delay=1.0, max_delay=60.0))
def create_invoice(payload: InvoiceRequest, ctx: JobContext) -> dict[str, Any]:
    # The operation key makes enqueueing idempotent; the handler should be too, because
    # a job whose worker vanished runs again. Here: derive the invoice number from the job.
    number = f"INV-{str(ctx.job.id)[:8].upper()}"
    return {"invoice": number, "customer_id": payload.customer_id,
            "amount_cents": payload.amount_cents, "currency": payload.currency}


@registry.handler("webhook.deliver", timeout=10)
def deliver_webhook(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    url = payload.get("url")
    if not isinstance(url, str) or not url.startswith("https://"):
        raise DiscardJob("webhook url must be an https:// URL")
    return {"delivered": url, "attempt": ctx.attempt}
