"""The job handlers of a team's own project: what HandlersModule (LEASEQ_HANDLERS) names.

The worker imports this module from the handlers layer and reads its ``registry``. It
uses packages of its own (humanize, pure Python, and msgpack, a C extension built for each
architecture; both from requirements.txt, in the same layer), its settings from the stack's
HandlersEnvironment parameter, and what the project grants its workers through leaseq's
parameters, within the workers' boundary: with ``ARCHIVE_BUCKET`` one AWS action
(s3:PutObject, template.yaml's HandlersPolicy as WorkerManagedPolicyArns), with
``SIGNING_KEY_SECRET`` one secret of its own name (HandlersSecretArns).
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

import humanize
import msgpack
from leaseq import DiscardJob, JobContext, Registry, RetryPolicy
from leaseq_lambda import handlers_environment
from pydantic import BaseModel, ConfigDict, Field

registry = Registry()

#: Read once, when the worker imports the module: a bad setting stops it at start.
SETTINGS = handlers_environment()
CURRENCY = SETTINGS.get("CURRENCY", "EUR")
#: Where rendered invoices are archived (s3:PutObject, granted by the project); empty: not.
ARCHIVE_BUCKET = SETTINGS.get("ARCHIVE_BUCKET", "")

#: The secret whose value signs each archived invoice (HMAC-SHA256); empty: unsigned.
SIGNING_KEY_SECRET = SETTINGS.get("SIGNING_KEY_SECRET", "")

#: The S3 client and the secrets provider, made on first use (boto3 comes with the Lambda
#: runtime, Powertools with leaseq's layer); tests replace them.
s3_client: Any = None
secrets: Any = None


def signing_key() -> bytes | None:
    """The signing key, read through Powertools' cache (five minutes), or None."""
    global secrets
    if not SIGNING_KEY_SECRET:
        return None
    if secrets is None:
        from aws_lambda_powertools.utilities.parameters import SecretsProvider

        secrets = SecretsProvider()
    return str(secrets.get(SIGNING_KEY_SECRET, max_age=300)).encode()


class Invoice(BaseModel):
    """The payload of an invoice.render job; a payload that does not fit makes it dead."""

    model_config = ConfigDict(extra="forbid")

    customer: str = Field(min_length=1, max_length=64)
    amount_cents: int = Field(gt=0)


def archive(key: str, document: dict[str, Any]) -> int:
    """Store ``document`` as MessagePack under ``key`` when archiving is on; its size."""
    global s3_client
    key_bytes = signing_key()
    if key_bytes is not None:
        unsigned: bytes = msgpack.packb(document, use_bin_type=True)
        document = {**document, "hmac_sha256": hmac.new(key_bytes, unsigned,
                                                          hashlib.sha256).hexdigest()}
    packed: bytes = msgpack.packb(document, use_bin_type=True)
    if ARCHIVE_BUCKET:
        if s3_client is None:
            import boto3

            s3_client = boto3.client("s3")
        s3_client.put_object(Bucket=ARCHIVE_BUCKET, Key=key, Body=packed,
                             ContentType="application/msgpack")
    return len(packed)


@registry.handler("invoice.render", payload=Invoice, timeout=10,
                  retry=RetryPolicy(base_delay=2, max_delay=120))
def render_invoice(payload: Invoice, ctx: JobContext) -> dict[str, Any]:
    # At-least-once: the invoice number comes from the job, so a rerun renders the same one
    # and overwrites the same archive object.
    number = f"INV-{str(ctx.job.id)[:8].upper()}"
    amount = humanize.intcomma(payload.amount_cents // 100)
    text = f"{payload.customer} owes {amount} {CURRENCY}"
    size = archive(f"invoices/{number}.msgpack",
                   {"invoice": number, "customer": payload.customer,
                    "amount_cents": payload.amount_cents, "currency": CURRENCY})
    return {"invoice": number, "text": text, "archived_bytes": size}


@registry.handler("report.monthly", timeout=600)
def monthly_report(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    # A slow kind: SlowKinds (the example's template) gives it a worker with a longer timeout.
    month = payload.get("month")
    if not isinstance(month, str):
        raise DiscardJob("payload.month must be a string such as 2026-11")
    return {"month": month, "rows": 0}
