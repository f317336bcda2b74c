"""A small HTTP client with cookies, for the page tests that need no browser.

:meth:`Client.enter` brings the local dashboard's key, as the operator's browser does.
"""

from __future__ import annotations

import http.client
import http.cookiejar
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass


@dataclass
class Page:
    status: int
    body: str
    headers: dict[str, str]

    def csrf(self) -> str:
        found = re.search(r'name="csrf" value="([^"]+)"', self.body)
        assert found, "the page has no CSRF field"
        return found.group(1)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


class Client:
    def __init__(self, base: str, *, follow: bool = True) -> None:
        self.base = base
        self.jar = http.cookiejar.CookieJar()
        handlers: list[urllib.request.BaseHandler] = [
            urllib.request.HTTPCookieProcessor(self.jar)]
        if not follow:
            handlers.append(_NoRedirect())
        self.opener = urllib.request.build_opener(*handlers)

    def _open(self, request: urllib.request.Request) -> Page:
        try:
            with self.opener.open(request, timeout=30) as response:
                return Page(response.status, response.read().decode(), dict(response.headers))
        except urllib.error.HTTPError as exc:
            return Page(exc.code, exc.read().decode(), dict(exc.headers))

    def enter(self, login_url: str) -> Client:
        """Bring the dashboard's key once: the answer sets the session cookie and
        redirects to the page without the key."""
        request = urllib.request.Request(login_url)  # noqa: S310
        try:
            with urllib.request.build_opener(
                    urllib.request.HTTPCookieProcessor(self.jar), _NoRedirect()
            ).open(request, timeout=30) as response:
                status, location = response.status, response.headers.get("Location")
        except urllib.error.HTTPError as exc:
            status, location = exc.code, exc.headers.get("Location")
        assert status == 303, status
        assert location is not None
        assert "key=" not in location, location
        return self

    def cookie(self, name: str) -> str:
        found = [c.value for c in self.jar if c.name == name and c.value]
        assert found, f"no cookie {name}"
        return found[0]

    def get(self, path: str) -> Page:
        return self._open(urllib.request.Request(self.base + path))  # noqa: S310

    def post(self, path: str, fields: list[tuple[str, str]],
             headers: dict[str, str] | None = None) -> Page:
        data = urllib.parse.urlencode(fields).encode()
        request = urllib.request.Request(  # noqa: S310
            self.base + path, data=data, method="POST",
                                         headers=headers or {})
        return self._open(request)


def send_raw(port: int, method: str, target: str, headers: list[tuple[str, str]],
             body: bytes = b"") -> Page:
    """One request to 127.0.0.1:port with exactly these headers (no Host unless given)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.putrequest(method, target, skip_host=True, skip_accept_encoding=True)
        for name, value in headers:
            connection.putheader(name, value)
        if body:
            connection.putheader("Content-Length", str(len(body)))
        connection.endheaders(body or None)
        response = connection.getresponse()
        answered = response.read().decode()
        found: dict[str, str] = {}
        for name, value in response.getheaders():
            found[name] = f"{found[name]}, {value}" if name in found else value
        return Page(response.status, answered, found)
    finally:
        connection.close()
