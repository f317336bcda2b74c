"""Which redirect targets stay on this dashboard: same-origin paths only.

The action forms carry a ``back`` path (where to go when the action is done), and the
local server redirects a request that brought its key to the same page without it. Both
end in a ``Location`` header, and a browser resolves ``//evil.example`` and
``/\\evil.example`` against the page as another host (it treats a backslash like a
slash and drops tabs and newlines before it parses). So a target is accepted only when
nothing a browser or a later decoder could do to it makes it leave the origin:

* printable ASCII without spaces: no control character (tab, newline, NUL, DEL), no
  format or bidi character; the pages' own targets are ``/jobs/<id>`` and ``/jobs?`` plus
  an urlencoded query, so this refuses nothing they make;
* no backslash anywhere;
* ``/`` alone, or ``/`` followed by a character that is neither ``/`` nor ``\\``;
* the path (before ``?`` or ``#``), percent-decoded again and again until it no longer
  changes, obeys the same rules (``/%2F%2Fevil``, ``/%5Cevil`` and ``/%09/evil`` are
  refused). The query is not decoded: an encoded backslash there is a filter's value,
  which no browser reads as part of a host.
"""

from __future__ import annotations

import unicodedata
from urllib.parse import unquote

#: The longest target accepted (the pages' own are far shorter).
MAX_LENGTH = 2000
_DECODE_ROUNDS = 5


def _starts_on_this_origin(text: str) -> bool:
    return text == "/" or (len(text) > 1 and text[0] == "/" and text[1] not in "/\\")


def _path_is_safe(path: str) -> bool:
    return ("\\" not in path and _starts_on_this_origin(path)
            and not any(unicodedata.category(c) in ("Cc", "Cf") for c in path))


def same_origin_path(value: str) -> str | None:
    """``value`` if it is a path on this origin by the rules above, else None."""
    if not value or len(value) > MAX_LENGTH:
        return None
    if not all("!" <= c <= "~" for c in value) or "\\" in value:
        return None
    if not _starts_on_this_origin(value):
        return None
    path = value.split("?", 1)[0].split("#", 1)[0]
    for _ in range(_DECODE_ROUNDS):
        if not _path_is_safe(path):
            return None
        decoded = unquote(path, errors="replace")
        if decoded == path:
            return value
        path = decoded
    return None  # still changing after several decodings: nobody's page makes that
