"""Who may use the local dashboard: whoever started it, through its own address only.

``leaseq dashboard`` answers as an operator's database login (with ``--stack``, the
production database's), on 127.0.0.1, because a browser speaks TCP and not Unix sockets.
Every OS user of the machine can connect there, and every web page the operator's
browser opens can make it send requests there (and, under a name that a DNS rebinding
attack points at 127.0.0.1, read the answers). So each request passes this door before
any page code runs, in this order:

1. **Host.** It must name this server exactly: ``127.0.0.1:PORT`` or ``localhost:PORT``
   (no name an attacker's DNS can point here: browsers resolve ``localhost`` themselves).
   Anything else gets 421, no Host or two of them 400, a request target that is not a
   path 400.
2. **Key.** Each run makes a random key (256 bits) and prints it in its URL,
   ``http://127.0.0.1:PORT/?key=...``, on the operator's terminal only (never on the
   command line, in the environment or in a file). A GET that brings the key is answered
   with a session cookie (``HttpOnly``, ``SameSite=Strict``, ``Path=/``, random per run
   too) and a redirect to the same page without the key, so it does not stay in the
   address bar, the history's current entry or a Referer. Every later request must carry
   the cookie. Without either, or with a key of another run, the answer is 403 and a
   page that says where the URL is. Both are compared in constant time.
3. **Origin.** A POST whose ``Origin`` is not this server's (or is ``null``), or whose
   ``Sec-Fetch-Site`` says another site, is refused with 403; the pages' CSRF check
   (:mod:`leaseq_dashboard.csrf`) then runs as well.

What passes reaches the pages without the door's cookie and without any
``X-Forwarded-*`` header (there is no proxy in front of this server, so such a header
could only be a client's invention). On Linux the server also refuses a connection that
another OS user opened (:mod:`leaseq_dashboard.peer`); elsewhere the key is what stops
them.
"""

from __future__ import annotations

import hmac
import html
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field
from urllib.parse import unquote_plus, urlsplit

from leaseq_dashboard.paths import same_origin_path

LOOPBACK = "127.0.0.1"
KEY_PARAMETER = "key"
_TOKEN_BYTES = 32  # secrets.token_urlsafe(32): 256 bits, 43 characters
_HEADERS = (
    ("Cache-Control", "no-store"),
    ("X-Content-Type-Options", "nosniff"),
    ("X-Frame-Options", "DENY"),
    ("Referrer-Policy", "no-referrer"),
    ("Content-Security-Policy", "default-src 'none'; frame-ancestors 'none'"),
)


@dataclass(frozen=True)
class Answer:
    """What the door answers itself: a refusal, or the redirect that sets the cookie."""

    status: int
    body: str
    content_type: str = "text/plain; charset=utf-8"
    headers: tuple[tuple[str, str], ...] = ()

    def all_headers(self) -> list[tuple[str, str]]:
        """The headers to send, the door's standard ones first."""
        return [("Content-Type", self.content_type), *_HEADERS, *self.headers]


@dataclass(frozen=True)
class Admitted:
    """A request the door let through, with the headers the pages may see."""

    headers: dict[str, str] = field(default_factory=dict)


class LocalDoor:
    """The checks above for the server on ``127.0.0.1:port``; one key and session per run."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.key = secrets.token_urlsafe(_TOKEN_BYTES)
        self._session = secrets.token_urlsafe(_TOKEN_BYTES)
        # Cookies are not kept apart by port: the name carries it, so two dashboards on
        # one machine do not overwrite each other's session.
        self.cookie_name = f"leaseq_local_{port}"
        names = (LOOPBACK, "localhost")
        self.hosts = frozenset(f"{n}:{port}" for n in names) | (
            frozenset(names) if port == 80 else frozenset())
        self.origins = frozenset(f"http://{h}" for h in self.hosts)

    @property
    def url(self) -> str:
        """The server's address, without the key."""
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def login_url(self) -> str:
        """The URL to print for the operator: it lets a browser in until the run ends."""
        return f"{self.url}/?{KEY_PARAMETER}={self.key}"

    def admit(self, method: str, target: str, headers: Iterable[tuple[str, str]]
              ) -> Answer | Admitted:
        """Let the request through (with the headers the pages may see), or answer it."""
        items = [(name.lower(), value) for name, value in headers]
        hosts = [value.strip() for name, value in items if name == "host"]
        if len(hosts) != 1:
            return Answer(400, f"{'No' if not hosts else 'More than one'} Host header: "
                               f"this dashboard answers only as {self.url}.\n")
        if hosts[0].lower() not in self.hosts:
            return Answer(421, f"This dashboard answers only as {self.url} (or "
                               f"http://localhost:{self.port}); this request was for "
                               f"{hosts[0][:200]!r}. A page that reaches this machine "
                               "under another name is refused.\n")
        if not target.startswith("/"):
            return Answer(400, "The request target must be a path such as /jobs.\n")
        cookies = _cookies(value for name, value in items if name == "cookie")
        parts = urlsplit(target)
        keys, rest = _split_key(parts.query)
        if keys:
            return self._exchange(method, parts.path, rest, keys)
        session = cookies.get(self.cookie_name)
        if session is None or not hmac.compare_digest(session.encode(),
                                                      self._session.encode()):
            return self._locked("This request brought neither the key nor the cookie "
                                "that the key gives.")
        refused = self._cross_origin(method, items)
        if refused:
            return Answer(403, refused + "\n")
        return Admitted(self._for_pages(items))

    def _exchange(self, method: str, path: str, rest: str, keys: list[str]
                  ) -> Answer:
        if method != "GET":
            return self._locked("The key is accepted only in the address of a page (GET).")
        if len(keys) != 1 or not hmac.compare_digest(keys[0].encode(), self.key.encode()):
            return self._locked("This key is not this run's: each start of leaseq "
                                "dashboard makes a new one.")
        location = same_origin_path(path) or "/"
        if rest:
            location = f"{location}?{rest}"
        cookie = (f"{self.cookie_name}={self._session}; Path=/; HttpOnly; "
                  "SameSite=Strict")
        return Answer(303, "", headers=(("Location", location), ("Set-Cookie", cookie)))

    def _locked(self, why: str) -> Answer:
        body = (
            "<!doctype html><html lang=\"en\"><meta charset=\"utf-8\">"
            "<title>Locked · leaseq</title><body>"
            "<h1>This dashboard is only for whoever started it</h1>"
            f"<p>{html.escape(why)}</p>"
            "<p>Open the URL that <code>leaseq dashboard</code> printed in its terminal: "
            f"<code>{html.escape(self.url)}/?key=…</code>. It lets this browser in until "
            "the command stops; the next start prints a new one.</p></body></html>")
        return Answer(403, body, "text/html; charset=utf-8")

    def _cross_origin(self, method: str, items: list[tuple[str, str]]) -> str | None:
        if method not in ("POST", "PUT", "PATCH", "DELETE"):
            return None
        for name, value in items:
            if name == "origin" and value.strip().lower() not in self.origins:
                return (f"cross-origin request refused: Origin {value[:200]!r} is not "
                        f"{self.url}")
            if name == "sec-fetch-site" and value.strip() not in ("same-origin", "none"):
                return f"cross-site request refused (Sec-Fetch-Site: {value[:50]})"
        return None

    def _for_pages(self, items: list[tuple[str, str]]) -> dict[str, str]:
        seen: dict[str, str] = {}
        for name, value in items:
            if name.startswith("x-forwarded-"):
                continue
            if name == "cookie":
                value = "; ".join(c for c in (p.strip() for p in value.split(";"))
                                  if c and c.partition("=")[0].strip() != self.cookie_name)
                if not value:
                    continue
            seen[name] = f"{seen[name]}; {value}" if name == "cookie" and name in seen \
                else value
        return seen


def _cookies(values: Iterable[str]) -> dict[str, str]:
    found: dict[str, str] = {}
    for value in values:
        for item in value.split(";"):
            name, _, content = item.partition("=")
            found.setdefault(name.strip(), content.strip())
    return found


def _split_key(query: str) -> tuple[list[str], str]:
    """The query's key values, and the rest of it exactly as it was written."""
    keys: list[str] = []
    rest: list[str] = []
    for piece in query.split("&") if query else []:
        name, _, value = piece.partition("=")
        if unquote_plus(name) == KEY_PARAMETER:
            keys.append(unquote_plus(value))
        elif piece:
            rest.append(piece)
    return keys, "&".join(rest)
