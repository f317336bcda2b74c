"""The stack's name must leave room for the names the template makes from it.

CloudFormation accepts stack names of up to 128 characters, but the template names some
resources ``<stack>-<suffix>``, and those have shorter limits: the worker's function name
(the name the worker and the enqueue function invoke it by), the enqueue rule and the RDS
Proxy. A name too long would fail late, at the first of those
resources, with a message about that resource. The migrations run before any of the functions
and the rule are created, so they refuse such a name first, saying which limit it breaks.
"""

from __future__ import annotations

from typing import Final

from leaseq.base.errors import ConfigurationError

#: (suffix, what the template names with it, that name's longest length)
DERIVED_NAMES: Final = (
    ("-worker", "the worker's FunctionName", 64),
    ("-slow", "the slow queue's worker's FunctionName", 64),
    ("-enqueue", "the enqueue rule on EnqueueEventBus", 64),
    ("-proxy", "the RDS Proxy of a database created here", 63),
)
#: The longest stack name every derived name fits.
MAX_STACK_NAME: Final = min(limit - len(suffix) for suffix, _, limit in DERIVED_NAMES)


def stack_name(stack_id: str) -> str:
    """``arn:aws:cloudformation:REGION:ACCOUNT:stack/NAME/UUID`` -> ``NAME``."""
    parts = stack_id.split("/")
    return parts[1] if len(parts) > 2 else ""


def check_stack_name(stack_id: str) -> None:
    """Refuse a stack name that one of the derived names would not fit."""
    name = stack_name(stack_id)
    too_long = [f"{name}{suffix} ({what}, at most {limit})"
                for suffix, what, limit in DERIVED_NAMES if len(name) + len(suffix) > limit]
    if too_long:
        raise ConfigurationError(
            f"the stack name {name!r} has {len(name)} characters, too many for the names made "
            f"from it: {'; '.join(too_long)}; deploy under a stack name of at most "
            f"{MAX_STACK_NAME} characters")
