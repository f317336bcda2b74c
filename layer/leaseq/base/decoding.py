"""JSON read back from PostgreSQL, decoded without ever raising.

PostgreSQL stores JSON that Python's decoder refuses: an integer of more than 4,300
digits (``'{"n": 1e5000}'::jsonb`` is stored as a 5,001-digit integer, and Python
caps int-from-text conversion at 4,300 digits), nesting deeper than the interpreter's
recursion limit, and, on a server whose encoding is not UTF-8, bytes that are not
UTF-8. A decoder that raises on such a value makes the whole read fail: for a claim,
after the claim has committed, so every job of the batch, of every tenant, is left
running and burns an attempt each time it is claimed again.

The loaders here are registered on every connection the library opens. They decode
with ``json.loads`` as psycopg's own loaders do (one Python call per value, no extra
frame on the common path), and return an :class:`UndecodableJson` in place of a value
the decoder refuses. The worker makes a job whose payload is undecodable dead with
reason ``UNDECODABLE_PAYLOAD``; the command line shows such a value as undecodable.

Floats are decoded as ``json.loads`` decodes them: a number whose magnitude is beyond a
float's range and that has a fraction (which only a SQL caller can store; the model
refuses non-finite floats) comes back as ``inf``, and a float's digits beyond 17 are
rounded. Neither raises.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from psycopg.abc import AdaptContext, Buffer
from psycopg.adapt import Loader
from psycopg.pq import Format

#: Characters of an undecodable value shown in errors and listings: enough to tell
#: which value it is, never the whole (possibly large, possibly private) document.
PREFIX_CHARS = 40

#: The longest decoder message kept.
MAX_REASON_CHARS = 300

#: What ``json.loads`` raises on text that PostgreSQL accepted: ValueError (digits
#: over the int limit; UnicodeDecodeError, a subclass, for bytes that are not UTF-8)
#: and RecursionError (nesting deeper than the stack allows).
DECODE_ERRORS = (ValueError, RecursionError)


@dataclass(frozen=True, slots=True, repr=False)
class UndecodableJson:
    """A stored JSON value that Python cannot decode, returned in its place.

    ``text`` is the value as the server sent it and ``reason`` the decoder's message.
    Its ``repr`` and :meth:`describe` show only a short prefix, so that logging one
    never echoes a whole payload.
    """

    text: str
    reason: str

    @classmethod
    def of(cls, data: bytes, error: BaseException) -> UndecodableJson:
        """The marker for ``data``, which the decoder refused with ``error``."""
        reason = str(error) or type(error).__name__
        return cls(data.decode("utf-8", "replace"), reason[:MAX_REASON_CHARS])

    @property
    def prefix(self) -> str:
        """The first characters of the text, to recognise the value by."""
        return self.text[:PREFIX_CHARS]

    def describe(self) -> str:
        """One line for people: why it cannot be decoded, and how it starts."""
        more = "..." if len(self.text) > PREFIX_CHARS else ""
        return (f"undecodable JSON ({self.reason}); {len(self.text)} characters, "
                f"starting {self.prefix}{more}")

    def as_document(self) -> dict[str, Any]:
        """A JSON object that stands for the value in JSON output."""
        return {"undecodable": True, "reason": self.reason, "prefix": self.prefix,
                "length": len(self.text)}

    def __repr__(self) -> str:
        return f"UndecodableJson(reason={self.reason!r}, prefix={self.prefix!r}, " \
               f"length={len(self.text)})"


class TotalJsonLoader(Loader):
    """Text-format ``json``/``jsonb``: the decoded value, or an :class:`UndecodableJson`."""

    def load(self, data: Buffer) -> Any:
        """Decode one value; never raises for text the server sent."""
        if not isinstance(data, bytes):
            data = bytes(data)
        try:
            return json.loads(data)
        except DECODE_ERRORS as exc:
            return UndecodableJson.of(data, exc)


class TotalJsonbBinaryLoader(Loader):
    """Binary-format ``jsonb`` (a version byte, then the text), decoded like the text form."""

    format = Format.BINARY

    def load(self, data: Buffer) -> Any:
        """Decode one value; an unknown version is undecodable too, not an error."""
        raw = bytes(data)
        if raw[:1] != b"\x01":
            return UndecodableJson(raw.decode("utf-8", "replace"),
                                   f"unknown jsonb binary format version {raw[:1]!r}")
        try:
            return json.loads(raw[1:])
        except DECODE_ERRORS as exc:
            return UndecodableJson.of(raw[1:], exc)


class TotalJsonBinaryLoader(TotalJsonLoader):
    """Binary-format ``json``, which is the text itself."""

    format = Format.BINARY


def register_total_json_loaders(context: AdaptContext) -> None:
    """Make ``context`` (a connection or cursor) decode json and jsonb totally."""
    adapters = context.adapters
    for type_name in ("json", "jsonb"):
        adapters.register_loader(type_name, TotalJsonLoader)
    adapters.register_loader("json", TotalJsonBinaryLoader)
    adapters.register_loader("jsonb", TotalJsonbBinaryLoader)
