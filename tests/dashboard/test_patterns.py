"""Principal patterns: ``*`` stays within one segment of the ARN, and the deployed
dashboard accepts only patterns that cannot be met by choosing a session name."""

from __future__ import annotations

from fnmatch import fnmatchcase

import pytest
from leaseq_dashboard import AccessDeniedError, AccessPolicy, DashboardSettings
from leaseq_dashboard.patterns import matches, pattern_problem
from pydantic import ValidationError

ACCOUNT = "123456789012"


def _sts(role: str, session: str) -> str:
    return f"arn:aws:sts::{ACCOUNT}:assumed-role/{role}/{session}"


@pytest.mark.parametrize(("pattern", "principal"), [
    # Meant: the users at the account's root path. fnmatch also took every path below.
    (f"arn:aws:iam::{ACCOUNT}:user/*", f"arn:aws:iam::{ACCOUNT}:user/contractors/mallory"),
    # A missing slash: meant the OnCall role, fnmatch also took OnCallFake's sessions.
    (f"arn:aws:sts::{ACCOUNT}:assumed-role/OnCall*", _sts("OnCallFake", "mallory")),
    (f"arn:aws:sts::{ACCOUNT}:assumed-role/OnCall*", _sts("OnCall", "ada")),
    # A session name with the look of a path.
    (f"arn:aws:sts::{ACCOUNT}:assumed-role/On?all/*", _sts("OnCall", "x") + "/y"),
])
def test_a_star_or_question_mark_never_matches_across_a_slash_as_fnmatch_did(
    pattern: str, principal: str,
) -> None:
    assert fnmatchcase(principal, pattern)  # the old matcher took it
    assert not matches(pattern, principal)


@pytest.mark.parametrize(("pattern", "principal", "expected"), [
    (f"arn:aws:sts::{ACCOUNT}:assumed-role/OnCall/*", _sts("OnCall", "ada"), True),
    (f"arn:aws:sts::{ACCOUNT}:assumed-role/OnCall/*", _sts("OnCallers", "ada"), False),
    (f"arn:aws:sts::{ACCOUNT}:assumed-role/AWSReservedSSO_OnCall_*/*",
     _sts("AWSReservedSSO_OnCall_0123abcd", "ada@example.com"), True),
    (f"arn:aws:iam::{ACCOUNT}:user/ops/*", f"arn:aws:iam::{ACCOUNT}:user/ops/ada", True),
    (f"arn:aws:iam::{ACCOUNT}:user/ops/*", f"arn:aws:iam::{ACCOUNT}:user/ops/x/ada", False),
    (f"arn:aws:iam::{ACCOUNT}:user/ada", f"arn:aws:iam::{ACCOUNT}:user/Ada", False),
    (f"arn:aws:iam::{ACCOUNT}:user/ad?", f"arn:aws:iam::{ACCOUNT}:user/ada", True),
])
def test_patterns_match_whole_arns_case_sensitively_segment_by_segment(
    pattern: str, principal: str, expected: bool,
) -> None:
    assert matches(pattern, principal) is expected


@pytest.mark.parametrize("pattern", [
    f"arn:aws:sts::{ACCOUNT}:assumed-role/OnCall/*",
    f"arn:aws:sts::{ACCOUNT}:assumed-role/OnCall/ada",
    f"arn:aws:sts::{ACCOUNT}:assumed-role/AWSReservedSSO_OnCall_*/*",
    f"arn:aws-us-gov:sts::{ACCOUNT}:assumed-role/Auditor/*",
    f"arn:aws:iam::{ACCOUNT}:user/*",
    f"arn:aws:iam::{ACCOUNT}:user/ops/ada",
    f"arn:aws:iam::{ACCOUNT}:root",
])
def test_patterns_that_name_a_role_a_user_or_the_account_are_accepted(pattern: str) -> None:
    assert pattern_problem(pattern) is None


@pytest.mark.parametrize(("pattern", "reason"), [
    # The attack: a session name is the assumer's choice, so this is anyone's.
    (f"arn:aws:sts::{ACCOUNT}:assumed-role/*/ada", "never match on the session name alone"),
    (f"arn:aws:sts::{ACCOUNT}:assumed-role/*Admin/*", "may end in one *"),
    (f"arn:aws:sts::{ACCOUNT}:assumed-role/On?all/*", "may end in one *"),
    (f"arn:aws:sts::{ACCOUNT}:assumed-role/OnCall", "assumed-role/ROLE/SESSION"),
    (f"arn:aws:sts::{ACCOUNT}:assumed-role/OnCall*", "assumed-role/ROLE/SESSION"),
    ("arn:aws:sts::*:assumed-role/OnCall/*", "12-digit account id"),
    ("arn:aws:sts::12345678901?:assumed-role/OnCall/*", "12-digit account id"),
    (f"arn:*:sts::{ACCOUNT}:assumed-role/OnCall/*", "partition"),
    (f"arn:aws:sts:us-east-1:{ACCOUNT}:assumed-role/OnCall/*", "no region"),
    (f"arn:aws:iam::{ACCOUNT}:role/OnCall", "never signs a request"),
    (f"arn:aws:sts::{ACCOUNT}:federated-user/ada", "chosen by the caller"),
    (f"arn:aws:iam::{ACCOUNT}:*", "must be literal"),
    (f"arn:aws:iam::{ACCOUNT}:user/[ab]da", "[...] is not a wildcard"),
    (f"arn:aws:iam::{ACCOUNT}:user//ada", "empty segment"),
    ("*", "is an IAM ARN"),
    ("local:ada", "is an IAM ARN"),
])
def test_unsafe_patterns_are_refused_with_the_reason(pattern: str, reason: str) -> None:
    problem = pattern_problem(pattern)
    assert problem is not None
    assert reason in problem


def test_the_settings_refuse_an_unsafe_pattern_in_any_role() -> None:
    for variable, value in (
        ("LEASEQ_DASHBOARD_OPERATORS", f"arn:aws:sts::{ACCOUNT}:assumed-role/OnCall/*,"
                                       f"arn:aws:sts::{ACCOUNT}:assumed-role/*/root"),
        ("LEASEQ_DASHBOARD_VIEWERS", "arn:aws:iam::*:user/auditor"),
        ("LEASEQ_DASHBOARD_TENANT_VIEWERS",
         '{"arn:aws:sts::123456789012:assumed-role/*/acme": '
         '"7b0c6a7e-5d1f-4a5e-9b7c-2f1d0c3e4a5b"}'),
    ):
        with pytest.raises(ValidationError, match="principal pattern"):
            DashboardSettings.from_env({variable: value})


def test_a_session_named_like_an_operator_in_another_role_is_not_an_operator() -> None:
    """Whoever may assume Dev may call the session 'ada'; it stays Dev's."""
    policy = AccessPolicy(operators=(f"arn:aws:sts::{ACCOUNT}:assumed-role/OnCall/*",),
                          viewers=(f"arn:aws:sts::{ACCOUNT}:assumed-role/Dev/*",))

    assert policy.viewer(_sts("OnCall", "ada")).role == "operator"
    assert policy.viewer(_sts("Dev", "ada")).role == "viewer"
    with pytest.raises(AccessDeniedError):
        policy.viewer(_sts("OnCallFake", "ada"))
