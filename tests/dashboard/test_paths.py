"""Redirect targets stay on the dashboard: the actions' ``back`` and the key's redirect.

Each target a browser would resolve to another host (or that a decoder could turn into
one) is refused, by the rule and through a real post that would otherwise redrive a job.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from leaseq_dashboard.paths import same_origin_path

from tests.dashboard.conftest import OPERATOR, Served
from tests.sql.calls import event_types, job
from tests.support.postgres import Conn

Serve = Callable[[str], Served]

OFF_SITE = {
    "backslash after the slash": "/\\evil.example",
    "two backslashes": "/\\\\evil.example",
    "protocol-relative": "//evil.example",
    "three slashes": "///evil.example",
    "encoded slashes": "/%2F%2Fevil.example",
    "encoded slashes, lower case": "/%2f%2fevil.example",
    "one encoded slash": "/%2Fevil.example",
    "encoded backslash": "/%5Cevil.example",
    "double-encoded slashes": "/%252F%252Fevil.example",
    "backslash later in the path": "/jobs\\..\\evil",
    "backslash in the query": "/jobs?state=dead\\",
    "tab between the slashes": "/\t/evil.example",
    "newline": "/jobs\n/evil.example",
    "carriage return": "/jobs\r\nLocation: http://evil.example",
    "NUL": "/jobs\x00",
    "DEL": "/jobs\x7f",
    "encoded tab between the slashes": "/%09/evil.example",
    "encoded NUL": "/jobs%00",
    "a C1 control": "/jobs\x85",
    "a bidi override": "/jobs\u202e",
    "a zero-width space": "/\u200b/evil.example",
    "a space": "/jobs /evil",
    "an absolute URL": "http://evil.example/",
    "a scheme without slashes": "javascript:alert(1)",
    "a relative path": "jobs",
    "empty": "",
    "too long": "/" + "a" * 2000,
}


@pytest.mark.parametrize("target", list(OFF_SITE.values()), ids=list(OFF_SITE))
def test_a_target_that_could_leave_the_origin_is_not_a_same_origin_path(target: str) -> None:
    assert same_origin_path(target) is None


@pytest.mark.parametrize("target", [
    "/", "/jobs", "/jobs?state=dead", "/jobs/9c5b94b1-35ad-4e4b-a8f8-1a7e1a0b5a01",
    "/jobs?state=dead&kind=report%5Cbuild&tenant=a",  # an encoded backslash is a value
    "/jobs?state=pending&kind=%2F%2Fnot-a-host", "/?window=6h#top",
])
def test_the_pages_own_targets_are_same_origin_paths(target: str) -> None:
    assert same_origin_path(target) == target


# The form's fields are trimmed first (a trailing C1 control is then simply gone).
POSTED = {k: v for k, v in OFF_SITE.items() if v and v.strip() == v}


@pytest.mark.parametrize("back", list(POSTED.values()), ids=list(POSTED))
def test_a_redrive_whose_back_leaves_the_origin_is_refused_with_400_and_changes_nothing(
    serve: Serve, owner: Conn, back: str
) -> None:
    served = serve(OPERATOR)
    client = served.client(follow=False)
    dead = served.seeded.jobs["dead"][0]
    token = client.get(f"/jobs/{dead}").csrf()
    for step in ([], [("confirmed", "yes")]):
        page = client.post("/actions/redrive", [("csrf", token), ("job", str(dead)),
                                                ("back", back), *step])
        assert page.status == 400, (back, page.status, page.headers.get("Location"))
        assert "back must be a path on this dashboard" in page.body
        assert "Location" not in page.headers
    assert job(owner, dead)["state"] == "dead"
    assert "redriven" not in event_types(owner, dead)


def test_a_redrive_goes_back_to_its_own_page_or_to_the_jobs_list_without_back(
    serve: Serve, owner: Conn
) -> None:
    served = serve(OPERATOR)
    client = served.client(follow=False)
    first, second = served.seeded.jobs["dead"]
    token = client.get(f"/jobs/{first}").csrf()
    own = client.post("/actions/redrive", [("csrf", token), ("job", str(first)),
                                           ("back", f"/jobs/{first}"), ("confirmed", "yes")])
    assert own.status == 303
    assert own.headers["Location"].startswith(f"/jobs/{first}?done=")
    plain = client.post("/actions/redrive", [("csrf", token), ("job", str(second)),
                                             ("confirmed", "yes")])
    assert plain.status == 303
    assert plain.headers["Location"].startswith("/jobs?done=")
    assert [job(owner, i)["state"] for i in (first, second)] == ["pending", "pending"]
