"""The local dashboard's door: only whoever started it, through its own address, gets in.

Each request here is sent with exactly the headers it names (no client fills in a Host),
to a dashboard served as ``leaseq dashboard`` serves it, over a seeded database. The
attack of the security review is replayed as it was run: a foreign Host read a tenant's
job page, took a CSRF token and cookie from it, and posted a redrive with a matching
Origin. A second OS user (a throwaway one, when the tests run as root) tries the server
with and without the key.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode, urlsplit

import pytest
from leaseq_dashboard import local_door, peer
from leaseq_dashboard.local_door import LocalDoor

from tests.dashboard.client import Page, send_raw
from tests.dashboard.conftest import OPERATOR, Served
from tests.sql.calls import event_types, job
from tests.support.os_users import another_os_user, run_as
from tests.support.postgres import Conn

Serve = Callable[[str], Served]


def _port(served: Served) -> int:
    return served.server.door.port


def _host(served: Served) -> tuple[str, str]:
    return ("Host", f"127.0.0.1:{_port(served)}")


def _session(served: Served) -> tuple[str, str]:
    """The cookie the key gives, taken the way a browser takes it."""
    entered = send_raw(_port(served), "GET", "/?" + urlencode({"key": served.server.door.key}),
                       [_host(served)])
    assert entered.status == 303, entered
    cookie = entered.headers["Set-Cookie"].split(";")[0]
    return ("Cookie", cookie)


def _locked(page: Page) -> bool:
    return page.status == 403 and "leaseq dashboard</code> printed" in page.body


def test_a_request_without_the_key_or_its_cookie_gets_403_and_a_page_that_says_how_to_get_in(
    serve: Serve, owner: Conn
) -> None:
    served = serve(OPERATOR)
    dead = served.seeded.jobs["dead"][1]
    for method, target in [("GET", "/"), ("GET", "/jobs?state=dead"), ("GET", f"/jobs/{dead}"),
                           ("GET", "/static/dashboard.css"), ("GET", "/no-such-page"),
                           ("POST", "/actions/redrive")]:
        page = send_raw(_port(served), method, target, [_host(served)],
                        urlencode({"job": str(dead), "confirmed": "yes"}).encode()
                        if method == "POST" else b"")
        assert _locked(page), (target, page)
        assert f"http://127.0.0.1:{_port(served)}/?key=" in page.body
        assert str(dead) not in page.body
        assert "Set-Cookie" not in page.headers  # the pages never ran: no CSRF cookie
    assert job(owner, dead)["state"] == "dead"


def test_a_key_of_another_run_an_empty_key_or_a_forged_cookie_is_refused(serve: Serve) -> None:
    served = serve(OPERATOR)
    port = _port(served)
    other_run = LocalDoor(port)  # the same port, started again: a new key and session
    name = served.server.door.cookie_name
    for target in [f"/?key={other_run.key}", "/?key=", "/?key",
                   f"/?key={served.server.door.key}&key={other_run.key}"]:
        page = send_raw(port, "GET", target, [_host(served)])
        assert _locked(page), (target, page)
        assert "Set-Cookie" not in page.headers
    value = _session(served)[1].partition("=")[2]
    for cookie in [f"{name}={other_run.key}", f"{name}=", f"{name}={value[:-1]}",
                   f"leaseq_local_{port + 1}={value}",  # another port's dashboard
                   f"{name}={served.server.door.key}"]:  # the key is not the cookie
        assert _locked(send_raw(port, "GET", "/", [_host(served), ("Cookie", cookie)])), cookie


def test_the_key_is_exchanged_for_a_strict_httponly_cookie_and_a_redirect_without_it(
    serve: Serve
) -> None:
    served = serve(OPERATOR)
    port, key = _port(served), served.server.door.key
    page = send_raw(port, "GET", f"/jobs?state=dead&key={key}&kind=report.build",
                    [_host(served)])
    assert page.status == 303
    assert page.headers["Location"] == "/jobs?state=dead&kind=report.build"
    assert key not in page.headers["Location"]
    name, _, rest = page.headers["Set-Cookie"].partition("=")
    value, *attributes = [a.strip() for a in rest.split(";")]
    assert name == f"leaseq_local_{port}"
    assert len(value) >= 43  # 256 bits
    assert value != key
    assert set(attributes) == {"Path=/", "HttpOnly", "SameSite=Strict"}
    inside = send_raw(port, "GET", "/jobs?state=dead&kind=report.build",
                      [_host(served), ("Cookie", f"{name}={value}")])
    assert inside.status == 200
    assert "report source missing" in inside.body
    # The redirect never leads off the site, whatever path the key came with.
    for target in ("//evil.example/", "/\\evil.example/", "/%2F%2Fevil.example/"):
        away = send_raw(port, "GET", f"{target}?key={key}", [_host(served)])
        assert away.status == 303
        location = away.headers["Location"]
        assert location.startswith("/")
        assert location[1:2] not in ("/", "\\"), location
        assert not urlsplit(location).netloc
    # A key is accepted in a page's address only, never in a post.
    assert _locked(send_raw(port, "POST", f"/actions/redrive?key={key}", [_host(served)],
                            b"confirmed=yes"))


@pytest.mark.parametrize("host", [
    "attacker.example:{port}", "127.0.0.1:{other}", "localhost:{other}", "127.0.0.1",
    "localhost", "127.0.0.2:{port}", "[::1]:{port}", "localhost.:{port}",
    "127.0.0.1:{port}.attacker.example", "127.0.0.1:{port}@attacker.example", "",
])
def test_a_foreign_host_is_refused_with_421_before_the_key_or_the_pages(
    serve: Serve, host: str
) -> None:
    served = serve(OPERATOR)
    port = _port(served)
    named = host.format(port=port, other=port + 1)
    key = served.server.door.key
    for target, extra in [("/", [_session(served)]), (f"/?key={key}", [])]:
        page = send_raw(port, "GET", target, [("Host", named), *extra])
        assert page.status == 421, (named, page)
        assert f"answers only as http://127.0.0.1:{port}" in page.body
        assert "Set-Cookie" not in page.headers  # no key exchanged, no page rendered


def test_a_missing_or_doubled_host_or_a_target_that_is_not_a_path_is_refused_with_400(
    serve: Serve
) -> None:
    served = serve(OPERATOR)
    port, session = _port(served), _session(served)
    missing = send_raw(port, "GET", "/", [session])
    assert (missing.status, "No Host header" in missing.body) == (400, True)
    doubled = send_raw(port, "GET", "/", [_host(served), ("Host", "attacker.example"), session])
    assert (doubled.status, "More than one Host" in doubled.body) == (400, True)
    absolute = send_raw(port, "GET", f"http://attacker.example:{port}/", [_host(served), session])
    assert absolute.status == 400
    assert "must be a path" in absolute.body


def test_localhost_with_the_servers_port_is_the_same_server(serve: Serve) -> None:
    served = serve(OPERATOR)
    port = _port(served)
    page = send_raw(port, "GET", "/", [("Host", f"LocalHost:{port}"), _session(served)])
    assert page.status == 200
    assert "Overview" in page.body


def test_the_reviews_attack_foreign_host_job_page_then_redrive_now_gets_nothing(
    serve: Serve, owner: Conn
) -> None:
    served = serve(OPERATOR)
    port = _port(served)
    victim = served.seeded.jobs["dead"][1]  # a dead job of the second tenant
    foreign = ("Host", f"attacker.example:{port}")
    origin = ("Origin", f"http://attacker.example:{port}")
    # Then: the job page, with its payload, and a CSRF cookie and token to reuse.
    page = send_raw(port, "GET", f"/jobs/{victim}", [foreign])
    assert page.status == 421
    assert str(victim) not in page.body
    assert "Set-Cookie" not in page.headers
    assert 'name="csrf"' not in page.body
    # Then: a post with a self-made CSRF pair and a matching Origin redrove the job.
    token = "t" * 43
    form = urlencode([("csrf", token), ("job", str(victim)), ("back", f"/jobs/{victim}"),
                      ("confirmed", "yes")]).encode()
    for headers in ([foreign, origin, ("Cookie", f"leaseq_csrf={token}")],
                    [_host(served), ("Origin", f"http://127.0.0.1:{port}"),
                     ("Cookie", f"leaseq_csrf={token}")]):  # the right Host, no key
        refused = send_raw(port, "POST", "/actions/redrive",
                           [*headers, ("Content-Type", "application/x-www-form-urlencoded")],
                           form)
        assert refused.status in (421, 403), refused
    assert job(owner, victim)["state"] == "dead"
    assert "redriven" not in event_types(owner, victim)
    # The operator, entered through the key, still can (and is named in the event).
    client = served.client()
    mine = client.get(f"/jobs/{victim}")
    assert mine.status == 200
    done = client.post("/actions/redrive", [("csrf", mine.csrf()), ("job", str(victim)),
                                            ("back", f"/jobs/{victim}"), ("confirmed", "yes")])
    assert done.status == 200
    assert job(owner, victim)["state"] == "pending"
    assert event_types(owner, victim).count("redriven") == 1


def test_a_post_from_another_origin_is_refused_at_the_door_even_with_the_cookie(
    serve: Serve, owner: Conn
) -> None:
    served = serve(OPERATOR)
    port, session = _port(served), _session(served)
    dead = served.seeded.jobs["dead"][0]
    client = served.client()
    token = client.get(f"/jobs/{dead}").csrf()
    form = urlencode([("csrf", token), ("job", str(dead)), ("confirmed", "yes")]).encode()
    csrf_cookie = f"leaseq_csrf={client.cookie('leaseq_csrf')}"
    cookie = ("Cookie", f"{session[1]}; {csrf_cookie}")
    for extra in ([("Origin", "http://attacker.example")], [("Origin", "null")],
                  [("Origin", f"http://127.0.0.1:{port + 1}")],
                  [("Origin", f"http://attacker.example:{port}"),
                   ("X-Forwarded-Host", f"attacker.example:{port}")],
                  [("Sec-Fetch-Site", "cross-site")], [("Sec-Fetch-Site", "same-site")]):
        page = send_raw(port, "POST", "/actions/redrive", [_host(served), cookie, *extra], form)
        assert page.status == 403, extra
        assert "refused" in page.body, extra
    assert job(owner, dead)["state"] == "dead"
    same = send_raw(port, "POST", "/actions/redrive",
                    [_host(served), cookie, ("Origin", f"http://127.0.0.1:{port}"),
                     ("Sec-Fetch-Site", "same-origin")], form)
    assert same.status == 303
    assert job(owner, dead)["state"] == "pending"


def test_the_pages_never_see_the_doors_cookie_or_a_forwarded_header() -> None:
    door = LocalDoor(8050)
    entered = door.admit("GET", f"/?key={door.key}", [("Host", "127.0.0.1:8050")])
    assert isinstance(entered, local_door.Answer)
    session = dict(entered.headers)["Set-Cookie"].split(";")[0]
    passed = door.admit("GET", "/", [
        ("Host", "127.0.0.1:8050"),
        ("Cookie", f"leaseq_csrf=abc; {session}; theme=dark"),
        ("X-Forwarded-Host", "attacker.example"), ("X-Forwarded-For", "203.0.113.9")])
    assert isinstance(passed, local_door.Admitted)
    assert passed.headers == {"host": "127.0.0.1:8050", "cookie": "leaseq_csrf=abc; theme=dark"}


# Another OS user ---------------------------------------------------------------------------

_INTRUDER = r"""
import http.client, json, sys
port, target = int(sys.argv[1]), sys.argv[2]
try:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    c.request("GET", target, headers={"Host": f"127.0.0.1:{port}"})
    r = c.getresponse()
    print(json.dumps({"status": r.status, "headers": dict(r.getheaders()),
                      "body": r.read().decode()}))
except OSError as exc:
    print(json.dumps({"error": repr(exc)}))
"""


def _python_for_anyone() -> str:
    # The tests' own interpreter may live under root's home, which another user cannot
    # enter; the intruder needs only the standard library.
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if shutil.which(candidate):
            return candidate
    pytest.skip("no system python3 that another OS user may run")
    return sys.executable


def _as_intruder(user: str, port: int, target: str) -> dict[str, Any]:
    ran = run_as(user, _python_for_anyone(), "-I", "-c", _INTRUDER, str(port), target)
    assert ran.returncode == 0, ran.stderr
    answer: dict[str, Any] = json.loads(ran.stdout)
    return answer


@pytest.mark.skipif(not peer.TABLES[0].exists(), reason="the connection's owner is read from "
                    "/proc/net/tcp, which only Linux has; elsewhere the key is the barrier "
                    "(the next test)")
def test_another_os_user_is_refused_on_linux_even_with_the_key(serve: Serve) -> None:
    served = serve(OPERATOR)
    port, key = _port(served), served.server.door.key
    dead = served.seeded.jobs["dead"][0]
    with another_os_user() as intruder:
        for target in ("/", f"/jobs/{dead}", f"/?key={key}", f"/jobs?state=dead&key={key}"):
            answer = _as_intruder(intruder, port, target)
            assert answer.get("status") == 403, answer
            assert "belongs to another OS user" in answer["body"]
            assert str(dead) not in answer["body"]
            assert "Set-Cookie" not in answer["headers"]
    assert send_raw(port, "GET", f"/?key={key}", [_host(served)]).status == 303  # the owner


def test_where_the_platform_cannot_tell_the_peer_another_os_user_still_needs_the_key(
    serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(peer, "peer_uid", lambda client, server: None)  # as on macOS
    served = serve(OPERATOR)
    port, key = _port(served), served.server.door.key
    dead = served.seeded.jobs["dead"][0]
    with another_os_user() as intruder:
        for target in ("/", f"/jobs/{dead}", f"/?key={LocalDoor(port).key}"):
            answer = _as_intruder(intruder, port, target)
            assert answer.get("status") == 403, answer
            assert "printed in its terminal" in answer["body"]
            assert str(dead) not in answer["body"]
        # Which is why the key goes to the operator's terminal and nowhere else: it is
        # the whole barrier there.
        assert _as_intruder(intruder, port, f"/?key={key}")["status"] == 303
