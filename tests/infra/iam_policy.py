"""Just enough of IAM's policy evaluation to ask the project's policies questions offline.

A request is an action on one or more resources with the request's condition keys, and
each resource's own keys (its tags); every resource must be allowed, and an explicit deny
anywhere wins. Statements are matched as IAM does: actions case-insensitively with ``*``
and ``?``, resources case-sensitively, condition keys case-insensitively, every operator
of a condition block and every key of an operator must hold (AND), any of a key's values
may match (OR), and a key missing from the request fails a condition, except under a
negated operator (``StringNotLike``), where IAM counts a missing key as not matching, so
the condition holds.

Only the operators the policies under ``infra/`` use are known; any other fails loudly
instead of being guessed. This is a reading of the policy language for these files, not
AWS's evaluator: it cannot say which keys AWS really puts in a request (that is what
infra/README.md says was, and was not, checked). No maintained library evaluates IAM
policies offline with conditions (moto does not enforce them for these services), hence
this module.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

#: operator -> (how a request value is compared with a policy value, negated)
_OPERATORS = {
    "StringEquals": (lambda have, want: have == want, False),
    "StringLike": (lambda have, want: fnmatch.fnmatchcase(have, want), False),
    "StringNotLike": (lambda have, want: fnmatch.fnmatchcase(have, want), True),
    "ArnLike": (lambda have, want: fnmatch.fnmatchcase(have, want), False),
}


@dataclass(frozen=True)
class Resource:
    """One resource of a request, with the condition keys that come from it (its tags)."""

    arn: str
    keys: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Request:
    """An action on resources, with the condition keys of the request itself."""

    action: str
    resources: tuple[Resource, ...]
    keys: Mapping[str, str] = field(default_factory=dict)


def request(action: str, *resources: str | Resource,
            keys: Mapping[str, str] | None = None) -> Request:
    """A request for ``action`` on ``resources`` (ARNs, or Resources with their keys)."""
    return Request(action, tuple(r if isinstance(r, Resource) else Resource(r)
                                 for r in resources), dict(keys or {}))


def statements(documents: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [dict(s) for document in documents for s in document["Statement"]]


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _conditions_hold(conditions: Mapping[str, Any], keys: Mapping[str, str]) -> bool:
    present = {key.lower(): value for key, value in keys.items()}
    for operator, tests in conditions.items():
        if operator not in _OPERATORS:
            raise NotImplementedError(f"condition operator {operator}: teach iam_policy it")
        compare, negated = _OPERATORS[operator]
        for key, wanted in tests.items():
            have = present.get(key.lower())
            if have is None:
                if not negated:
                    return False
                continue
            matched = any(compare(have, want) for want in _as_list(wanted))
            if matched == negated:
                return False
    return True


def _applies(statement: Mapping[str, Any], action: str, resource: Resource,
             keys: Mapping[str, str]) -> bool:
    if "NotAction" in statement or "NotResource" in statement:
        raise NotImplementedError("NotAction / NotResource: teach iam_policy them")
    if not any(fnmatch.fnmatchcase(action.lower(), a.lower())
               for a in _as_list(statement["Action"])):
        return False
    if not any(fnmatch.fnmatchcase(resource.arn, r) for r in _as_list(statement["Resource"])):
        return False
    return _conditions_hold(statement.get("Condition", {}), {**keys, **resource.keys})


def decision(policy: list[dict[str, Any]], asked: Request) -> str:
    """"allowed", "denied" (an explicit deny matched) or "not allowed" (no allow did)."""
    verdict = "allowed"
    for resource in asked.resources:
        if any(s["Effect"] == "Deny" and _applies(s, asked.action, resource, asked.keys)
               for s in policy):
            return "denied"
        if not any(s["Effect"] == "Allow" and _applies(s, asked.action, resource, asked.keys)
                   for s in policy):
            verdict = "not allowed"
    return verdict


def allows(policy: list[dict[str, Any]], asked: Request) -> bool:
    return decision(policy, asked) == "allowed"
