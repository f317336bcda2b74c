"""Settings for your job handlers, given to the stack as one parameter.

CloudFormation cannot turn a parameter into environment variables of its own, so the
stack's ``HandlersEnvironment`` parameter (a JSON object of strings) reaches the workers as
one variable, ``LEASEQ_HANDLERS_ENVIRONMENT``, and a handlers module reads it here, once,
at import: a malformed value fails the worker's start with a ConfigurationError naming the
parameter, instead of a job failing later. Keep secrets out of it (it is visible to
anyone who can read the function's configuration): put the name of a secret here.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

from leaseq import ConfigurationError

__all__ = ["ENVIRONMENT_VARIABLE", "handlers_environment"]

#: The variable template.yaml sets from the HandlersEnvironment parameter.
ENVIRONMENT_VARIABLE = "LEASEQ_HANDLERS_ENVIRONMENT"


def handlers_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The handlers' settings: the JSON object in LEASEQ_HANDLERS_ENVIRONMENT ({} if unset)."""
    env = os.environ if environ is None else environ
    text = env.get(ENVIRONMENT_VARIABLE, "").strip() or "{}"
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigurationError(
            f"{ENVIRONMENT_VARIABLE} (the stack's HandlersEnvironment) is not JSON: {exc.msg} "
            f"at column {exc.colno}; give an object such as {{\"BUCKET\": \"invoices\"}}"
        ) from exc
    if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise ConfigurationError(
            f"{ENVIRONMENT_VARIABLE} (the stack's HandlersEnvironment) must be a JSON object "
            "of strings, such as {\"BUCKET\": \"invoices\", \"RETRIES\": \"3\"}")
    return dict(value)
