"""The handlers module the function tests name in LEASEQ_HANDLERS.

It follows the documented convention (a module-level ``registry``) and registers the
kinds the sample events in events/ use, plus a few that misbehave on purpose.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from aws_lambda_powertools import Logger
from leaseq import JobContext, Registry
from pydantic import BaseModel, ConfigDict

registry = Registry()
#: A user's own Powertools logger, as in any Lambda code (the service is spelled out
#: because the tests import this module before they set POWERTOOLS_SERVICE_NAME).
logger = Logger(service="leaseq", child=True)

#: Set by tests to let "stuck" handlers (abandoned in a thread) finish.
release_stuck = threading.Event()
#: Called by send_welcome_email while it runs, when a test sets it (to look at the
#: database from inside an invocation).
on_run: Callable[[], None] | None = None


class WelcomeEmail(BaseModel):
    model_config = ConfigDict(extra="forbid")
    to: str
    name: str = "there"


class ChargeCard(BaseModel):
    order_id: str
    amount_cents: int


class ResizeImage(BaseModel):
    url: str
    width: int
    height: int


@registry.handler("send_welcome_email", payload=WelcomeEmail, timeout=5)
def send_welcome_email(email: WelcomeEmail, ctx: JobContext) -> dict[str, Any]:
    logger.info("sending the welcome email", extra={"recipient": email.to})
    if on_run is not None:
        on_run()
    return {"sent_to": email.to}


@registry.handler("charge_card", payload=ChargeCard, timeout=5)
def charge_card(charge: ChargeCard, ctx: JobContext) -> dict[str, Any]:
    return {"charged": charge.amount_cents}


@registry.handler("resize_image", payload=ResizeImage, timeout=5)
def resize_image(image: ResizeImage, ctx: JobContext) -> dict[str, Any]:
    return {"size": [image.width, image.height]}


@registry.handler("stuck", timeout=0.3)
def stuck(payload: Any, ctx: JobContext) -> None:
    release_stuck.wait(30)
