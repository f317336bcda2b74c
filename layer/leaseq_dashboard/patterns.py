"""Principal patterns: how a pattern of the access policy matches an IAM principal, and
which patterns the deployed dashboard accepts.

Why not :func:`fnmatch.fnmatchcase`: its ``*`` matches ``/`` too, so
``arn:aws:sts::123456789012:assumed-role/*/ada`` names the session ``ada`` of *every*
role, and ``arn:aws:iam::123456789012:user/*`` every user under every path. Here:

* ``*`` matches any run of characters within one segment of the ARN's resource path
  (never a ``/``); ``?`` matches one such character. There is no other wildcard: a
  ``[`` is refused (no IAM name can hold one).
* Matching is case-sensitive and against the whole principal ARN.

Which patterns are safe (:func:`pattern_problem` refuses the rest, at cold start and at
deploy time, so a risky list never goes live):

* The partition and the account are literal: a wildcard there trusts other accounts.
* ``arn:PARTITION:sts::ACCOUNT:assumed-role/ROLE/SESSION`` (how an assumed role's
  sessions sign requests): ROLE is literal, or a literal prefix and one trailing ``*``
  (``AWSReservedSSO_OnCall_*`` for an IAM Identity Center permission set). Never a bare
  ``*``: **the session name is chosen by whoever assumes the role**, so a pattern that
  matches on the session name alone names anyone who may assume any role. SESSION may
  be ``*``, which trusts every session of the role: that is right exactly when assuming
  the role is itself restricted (its trust policy). A literal session
  (``assumed-role/Dev/ada``) tells sessions of one role apart only where something
  other than the caller sets the name (Identity Center, or a trust policy that requires
  ``sts:RoleSessionName`` to be ``${aws:username}``); otherwise anyone who may assume
  Dev may call the session ``ada``.
* ``arn:PARTITION:iam::ACCOUNT:user/PATH/NAME``: any segment may hold wildcards (users
  are made by whoever may call ``iam:CreateUser``).
* ``arn:PARTITION:iam::ACCOUNT:root``: the account's root user, literally.
* Anything else (``role/...``, which never signs a request; ``federated-user/...``,
  whose name the caller of ``GetFederationToken`` picks) is refused.

Written here, not taken from a library: the rule is this dashboard's own (a segment-
bound ``*`` and the rules above), and it is a dozen lines over :mod:`re`.
"""

from __future__ import annotations

import re
from functools import cache

_ARN = re.compile(
    r"^arn:(?P<partition>[^:]*):(?P<service>[^:]*):(?P<region>[^:]*):(?P<account>[^:]*):"
    r"(?P<resource>.*)$")
_PARTITION = re.compile(r"^aws(-[a-z]+)*$")
_ACCOUNT = re.compile(r"^[0-9]{12}$")
_WILDCARD = re.compile(r"[*?]")
#: What IAM allows in names, plus the two wildcards.
_SEGMENT = re.compile(r"^[A-Za-z0-9_+=,.@*?-]+$")


@cache
def _compiled(pattern: str) -> re.Pattern[str]:
    parts = []
    for char in pattern:
        if char == "*":
            parts.append("[^/]*")
        elif char == "?":
            parts.append("[^/]")
        else:
            parts.append(re.escape(char))
    return re.compile("".join(parts), re.DOTALL)


def matches(pattern: str, principal: str) -> bool:
    """Whether ``principal`` is named by ``pattern`` (``*`` and ``?`` within a segment)."""
    return _compiled(pattern).fullmatch(principal) is not None


def _assumed_role_problem(segments: list[str]) -> str | None:
    if len(segments) != 3:
        return "an assumed role's sessions are assumed-role/ROLE/SESSION"
    role, session = segments[1], segments[2]
    if "?" in role or "*" in role[:-1]:
        return (f"the role name {role!r} may end in one * and hold no other wildcard: "
                "the session name is chosen by whoever assumes a role, so a pattern must "
                "never match on the session name alone")
    if role == "*" or not role:
        return ("name the role: the session name is chosen by whoever assumes a role, so "
                "a pattern must never match on the session name alone")
    if not session:
        return "the session segment is empty (use * for every session of the role)"
    return None


def pattern_problem(pattern: str) -> str | None:
    """Why ``pattern`` is not a safe principal pattern for the deployed dashboard, or None
    (the rules are in the module docstring)."""
    found = _ARN.match(pattern)
    if found is None:
        return "a principal pattern is an IAM ARN (arn:aws:...)"
    if "[" in pattern or "]" in pattern:
        return "[...] is not a wildcard here: use * or ?"
    if not _PARTITION.match(found["partition"]):
        return f"the partition {found['partition']!r} must be literal (aws, aws-cn, ...)"
    if found["region"]:
        return "IAM and STS principal ARNs have no region"
    if not _ACCOUNT.match(found["account"]):
        return (f"the account {found['account']!r} must be a literal 12-digit account id: a "
                "wildcard there trusts other accounts")
    service, resource = found["service"], found["resource"]
    segments = resource.split("/")
    if any(not _SEGMENT.match(segment) for segment in segments):
        return f"{resource!r} holds an empty segment or a character no IAM name has"
    if service == "sts" and segments[0] == "assumed-role":
        return _assumed_role_problem(segments)
    if service == "iam" and segments[0] == "user" and len(segments) >= 2:
        return None
    if service == "iam" and resource == "root":
        return None
    if _WILDCARD.search(f"{service}:{segments[0]}"):
        return "the kind of principal (user, assumed-role, root) must be literal"
    return (f"{service}:{segments[0]} principals are not accepted: name IAM users "
            "(iam::ACCOUNT:user/NAME), sessions of a role (sts::ACCOUNT:assumed-role/ROLE/"
            "SESSION) or the account's root (iam::ACCOUNT:root); a role's own ARN "
            "(iam::ACCOUNT:role/...) never signs a request, and federated-user names are "
            "chosen by the caller")


def check_pattern(pattern: str) -> str:
    """``pattern`` if it is safe, else ValueError saying why (for settings validators)."""
    problem = pattern_problem(pattern)
    if problem is not None:
        raise ValueError(f"principal pattern {pattern!r}: {problem}")
    return pattern
