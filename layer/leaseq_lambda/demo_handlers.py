"""The demo's job handlers: what ``leaseq demo`` drains, and what a first deployed stack
runs (``HandlersModule=leaseq_lambda.demo_handlers``). It ships in the Lambda layer for
that reason, and is a module like the one a Lambda names in LEASEQ_HANDLERS, exposing a
module-level ``registry``.

Each kind shows one behaviour of the queue:

* ``send_welcome_email`` succeeds;
* ``charge_card`` fails its first ``fail_times`` attempts as a flaky payment gateway
  would, then succeeds (short retry delays so the demo stays quick);
* ``resize_image`` validates its payload with a pydantic model: a payload that does not
  fit makes the job dead at once, because retrying cannot fix it;
* ``sync_crm`` refuses a payload it cannot ever process with ``DiscardJob``.
"""

from __future__ import annotations

import random
import time
from typing import Any

from leaseq import DiscardJob, JobContext, Registry, RetryPolicy
from pydantic import BaseModel, ConfigDict, Field

registry = Registry()

#: Quick retries: a demo should not wait minutes for a backoff.
DEMO_RETRY = RetryPolicy(base_delay=0.4, max_delay=2.0)


def _work(seconds: float = 0.04) -> None:
    """Stand-in for the time a real call to another service takes."""
    time.sleep(seconds * (0.5 + random.random()))


class WelcomeEmail(BaseModel):
    """The payload of ``send_welcome_email``: an unknown field is refused."""

    model_config = ConfigDict(extra="forbid")

    to: str = Field(min_length=3, max_length=320)
    name: str = Field(default="there", max_length=200)


class ChargeCard(BaseModel):
    """The payload of ``charge_card``; ``fail_times`` is how many attempts the gateway
    times out before one succeeds."""

    model_config = ConfigDict(extra="forbid")

    order_id: str = Field(min_length=1, max_length=100)
    amount_cents: int = Field(gt=0, le=10_000_000)
    fail_times: int = Field(default=0, ge=0, le=10)


class ResizeImage(BaseModel):
    """The payload of ``resize_image``: a size out of range makes the job dead at once."""

    model_config = ConfigDict(extra="forbid")

    url: str = Field(min_length=1, max_length=2000)
    width: int = Field(ge=1, le=10_000)
    height: int = Field(ge=1, le=10_000)


class GatewayTimeout(Exception):
    """What a payment client raises when the gateway does not answer in time."""


@registry.handler("send_welcome_email", payload=WelcomeEmail, timeout=5)
def send_welcome_email(payload: WelcomeEmail, ctx: JobContext) -> dict[str, Any]:
    """Succeeds: the job every run of the demo completes on the first attempt."""
    _work()
    return {"delivered_to": payload.to}


@registry.handler("charge_card", payload=ChargeCard, timeout=5, retry=DEMO_RETRY)
def charge_card(payload: ChargeCard, ctx: JobContext) -> dict[str, Any]:
    """Fails its first ``fail_times`` attempts, then succeeds: retries with backoff."""
    _work()
    if ctx.attempt <= payload.fail_times:
        raise GatewayTimeout(
            f"payment gateway timed out on attempt {ctx.attempt} for order {payload.order_id}")
    return {"order_id": payload.order_id, "charged_cents": payload.amount_cents,
            "attempts": ctx.attempt}


@registry.handler("resize_image", payload=ResizeImage, timeout=5, retry=DEMO_RETRY)
def resize_image(payload: ResizeImage, ctx: JobContext) -> dict[str, Any]:
    """Succeeds for a payload its model accepts; the others are dead before it runs."""
    _work(0.08)
    return {"thumbnail": f"{payload.url}?w={payload.width}&h={payload.height}"}


@registry.handler("sync_crm", timeout=5, retry=DEMO_RETRY)
def sync_crm(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """Discards a job without an account: no retry could ever process it."""
    _work()
    if payload.get("account") is None:
        raise DiscardJob("the CRM account is unknown; no retry can fix that")
    return {"synced": payload["account"]}
