"""CSRF protection for the dashboard's actions: a double-submit token plus origin checks.

Why not only rely on IAM: a browser cannot sign SigV4 requests itself, so people reach
the function URL through a signing proxy on their own machine (or, locally, the
``leaseq dashboard`` server). Any web page the browser visits could post a form to that
proxy, and the proxy would sign it with the operator's credentials. So every POST must
prove it came from a page this dashboard rendered:

* a random token is set as an ``HttpOnly``, ``SameSite=Strict`` cookie and repeated in
  every form as a hidden field; the two must match (compared in constant time). Another
  site can make the browser send the cookie (not with Strict), but cannot read it to
  put it in the form;
* when the browser says where the request comes from (``Origin``, ``Sec-Fetch-Site``),
  it must be this site.

Stateless (no server-side session store), so it works across Lambda execution
environments.
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Mapping
from urllib.parse import urlsplit

COOKIE = "leaseq_csrf"
FIELD = "csrf"


def new_token() -> str:
    """A fresh unguessable token (256 bits)."""
    return secrets.token_urlsafe(32)


def cookie_token(cookies: Mapping[str, str]) -> str | None:
    """The token of the request's cookie, if it has a well-formed one."""
    token = cookies.get(COOKIE)
    return token if token and 20 <= len(token) <= 100 and token.isascii() else None


def check(*, cookie: str | None, submitted: str | None, headers: Mapping[str, str]) -> str | None:
    """None when the POST is acceptable, else why it is refused."""
    if not cookie or not submitted:
        return "the form has no CSRF token (reload the page and try again)"
    if not hmac.compare_digest(cookie.encode(), submitted.encode()):
        return "the form's CSRF token does not match (reload the page and try again)"
    fetch_site = headers.get("sec-fetch-site")
    if fetch_site is not None and fetch_site not in ("same-origin", "none"):
        return f"cross-site request refused (Sec-Fetch-Site: {fetch_site})"
    origin = headers.get("origin")
    host = headers.get("x-forwarded-host") or headers.get("host")
    if origin is not None and origin != "null":
        if host is None or urlsplit(origin).netloc != host:
            return "cross-origin request refused (Origin does not match Host)"
    elif origin == "null":
        return "cross-origin request refused (Origin: null)"
    return None
