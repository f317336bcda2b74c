"""An offline evaluator of the IAM policy statements that decide who may invoke a Lambda
function, for the tests of the dashboard's invoke permissions.

Why one is written here: no maintained Python package evaluates resource-based policies
with conditions offline. moto 5 (``moto/iam/access_control.py``) says so itself: it skips
resource-based policies and evaluates only ``StringEquals`` conditions, treating every
other operator (``Bool`` included) as met, so it would allow the very direct Invoke
these tests must show refused. IAM Access Analyzer's policy checks and the IAM policy
simulator need an AWS account.

What it implements, from AWS's documented evaluation logic for one account (and
nothing it was not asked to: anything else raises :class:`UnsupportedPolicyError`
instead of being guessed):

* A request is allowed when a statement of the principal's identity policies or of the
  resource's policy allows it and no statement denies it; an explicit deny wins. With a
  permissions boundary, an identity-policy allow counts only where the boundary allows
  too. A resource-policy statement whose principal is an account (``123456789012`` or
  its ``:root``) delegates to that account's identity policies and grants nothing by
  itself; one naming the principal's ARN, or ``*``, grants directly.
* ``Action``/``NotAction`` with ``*`` and ``?`` wildcards, compared without case;
  ``Resource``/``NotResource`` with the same wildcards, compared with case.
* Conditions: every operator of a statement and every key of an operator must hold
  (AND); the values of one key are alternatives (OR). Operators ``Bool``,
  ``StringEquals``, ``StringNotEquals``, ``StringLike``, ``StringNotLike``, ``ArnLike``,
  ``ArnEquals``, each also as ``...IfExists``. A key missing from the request makes a
  condition false, except for ``...IfExists`` (true) and the negated operators
  (``StringNotEquals``, ``StringNotLike``: true), as AWS documents.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


class UnsupportedPolicyError(Exception):
    """A statement uses a part of the policy language this evaluator does not implement."""


@dataclass(frozen=True)
class Request:
    """One authorization question: who, which action, on what, with which context keys."""

    principal: str
    action: str
    resource: str
    context: Mapping[str, str] = field(default_factory=dict)


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else [value]


def _wildcard(pattern: str, value: str, *, ignore_case: bool) -> bool:
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    flags = re.IGNORECASE | re.DOTALL if ignore_case else re.DOTALL
    return re.fullmatch(regex, value, flags) is not None


def _matches_any(patterns: Any, value: str, *, ignore_case: bool) -> bool:
    return any(_wildcard(str(p), value, ignore_case=ignore_case) for p in _as_list(patterns))


def _account_of(arn: str) -> str | None:
    parts = arn.split(":")
    return parts[4] if len(parts) > 5 and parts[0] == "arn" else None


_OPERATORS = {
    "Bool": (lambda expected, actual: expected.lower() == actual.lower(), False),
    "StringEquals": (lambda expected, actual: expected == actual, False),
    "StringNotEquals": (lambda expected, actual: expected != actual, True),
    "StringLike": (lambda expected, actual: _wildcard(expected, actual, ignore_case=False),
                   False),
    "StringNotLike": (lambda expected, actual: not _wildcard(expected, actual,
                                                             ignore_case=False), True),
    "ArnLike": (lambda expected, actual: _wildcard(expected, actual, ignore_case=False), False),
    "ArnEquals": (lambda expected, actual: expected == actual, False),
}


def _condition_holds(condition: Mapping[str, Any], context: Mapping[str, str]) -> bool:
    for operator, keys in condition.items():
        base, if_exists = (operator[:-len("IfExists")], True) if operator.endswith(
            "IfExists") else (operator, False)
        if base not in _OPERATORS or ":" in base:
            raise UnsupportedPolicyError(f"condition operator {operator}")
        compare, negated = _OPERATORS[base]
        for key, expected in keys.items():
            actual = next((v for k, v in context.items() if k.lower() == key.lower()), None)
            if actual is None:
                if not (if_exists or negated):
                    return False
                continue
            values = [str(v) for v in _as_list(expected)]
            holds = all(compare(v, actual) for v in values) if negated else any(
                compare(v, actual) for v in values)
            if not holds:
                return False
    return True


def _applies(statement: Mapping[str, Any], request: Request) -> bool:
    known = {"Sid", "Effect", "Action", "NotAction", "Resource", "NotResource", "Condition",
             "Principal"}
    if set(statement) - known:
        raise UnsupportedPolicyError(f"statement elements {sorted(set(statement) - known)}")
    if "Action" in statement:
        if not _matches_any(statement["Action"], request.action, ignore_case=True):
            return False
    elif "NotAction" in statement:
        if _matches_any(statement["NotAction"], request.action, ignore_case=True):
            return False
    else:
        raise UnsupportedPolicyError("a statement needs Action or NotAction")
    if "Resource" in statement:
        if not _matches_any(statement["Resource"], request.resource, ignore_case=False):
            return False
    elif "NotResource" in statement and _matches_any(
            statement["NotResource"], request.resource, ignore_case=False):
        return False
    return _condition_holds(statement.get("Condition") or {}, request.context)


def _names(principal: Any) -> tuple[bool, list[str]]:
    """(names everyone, the AWS principals it names)."""
    if principal == "*":
        return True, []
    if not isinstance(principal, Mapping):
        raise UnsupportedPolicyError(f"principal {principal!r}")
    unknown = set(principal) - {"AWS", "Service"}
    if unknown:
        raise UnsupportedPolicyError(f"principal kinds {sorted(unknown)}")
    aws = [str(p) for p in _as_list(principal.get("AWS", []))]
    return "*" in aws, aws


@dataclass(frozen=True)
class Decision:
    """The answer and the statements that made it (for the failure messages)."""

    allowed: bool
    allowed_by: tuple[str, ...] = ()
    denied_by: tuple[str, ...] = ()


def _label(source: str, statement: Mapping[str, Any]) -> str:
    return f"{source}:{statement.get('Sid', statement.get('Action', statement.get('NotAction')))}"


def evaluate(request: Request, *, identity: Iterable[Mapping[str, Any]] = (),
             resource: Iterable[Mapping[str, Any]] = (),
             boundary: Sequence[Mapping[str, Any]] | None = None) -> Decision:
    """Whether ``request`` is allowed by these identity, resource and boundary statements."""
    allows: list[str] = []
    denies: list[str] = []
    identity_allows: list[str] = []
    for statement in identity:
        if _applies(statement, request):
            (denies if statement["Effect"] == "Deny" else identity_allows).append(
                _label("identity", statement))
    for statement in resource:
        everyone, named = _names(statement.get("Principal"))
        account = _account_of(request.principal)
        direct = everyone or request.principal in named
        delegated = any(p in (account, f"arn:aws:iam::{account}:root") for p in named)
        if not (direct or delegated) or not _applies(statement, request):
            continue
        if statement["Effect"] == "Deny":
            denies.append(_label("resource", statement))
        elif direct:
            allows.append(_label("resource", statement))
    if boundary is not None and identity_allows:
        bounded = [s for s in boundary if s["Effect"] == "Allow" and _applies(s, request)]
        if any(s["Effect"] == "Deny" and _applies(s, request) for s in boundary):
            bounded = []
        identity_allows = identity_allows if bounded else []
    allows += identity_allows
    return Decision(bool(allows) and not denies, tuple(allows), tuple(denies))
