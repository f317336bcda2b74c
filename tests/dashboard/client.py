"""A small HTTP client with cookies, for the page tests that need no browser."""

from __future__ import annotations

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
