"""What PostgreSQL can store and a worker can read back: the SQL contract's value rules,
checked in Python before anything is sent.

Each rule here has a twin in the SQL functions (``sql/README.md``) that refuses the
same values with SQLSTATE 22023, so a library caller and a SQL caller get the same
answer. Checking in Python first matters for batches: one value PostgreSQL refuses
makes the whole statement fail, while a value refused here is one rejected item.
"""

from __future__ import annotations

import json
import math
import unicodedata
from datetime import timedelta
from typing import Any

#: Payload and result size bound, in bytes of JSON text.
MAX_DOCUMENT_BYTES = 262_144

#: Nesting bound: no value more than this many levels below the payload object. Far
#: deeper documents cannot be decoded by Python's json module, so a worker could never
#: read them back.
MAX_PAYLOAD_DEPTH = 100

#: The longest JSON number, in characters as PostgreSQL writes it (digits, and a minus
#: sign for a negative number). PostgreSQL stores numbers of any length, and writes
#: them without an exponent (``1e5000`` comes back as 5,001 digits), while Python
#: refuses to decode an integer of more than 4,300 digits. A bound well below that
#: leaves room for readers whose limit is set lower (640 at the least); every float
#: Python can send is far shorter (at most about 330 characters).
MAX_NUMBER_CHARS = 1000

#: How far ahead a job may be scheduled.
MAX_SCHEDULE_AHEAD = timedelta(days=365)

NUL_PROBLEM = "must not contain NUL characters (U+0000); PostgreSQL cannot store them"

# The range of integers whose JSON text has at most MAX_NUMBER_CHARS characters,
# compared without converting the integer to text (which itself raises above 4,300
# digits, and costs quadratic time below that).
_LARGEST_INT = 10**MAX_NUMBER_CHARS - 1
_SMALLEST_INT = -(10 ** (MAX_NUMBER_CHARS - 1) - 1)
_LOG10_2 = math.log10(2)

#: Code points that show nothing: the Unicode White_Space property. Spelled out rather
#: than taken from ``str.isspace`` (which adds U+001C..U+001F) so that the SQL side can
#: use exactly the same set.
WHITE_SPACE = frozenset(
    "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008"
    "\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)

#: Invisible format characters (Unicode category Cf, as of Unicode 15.1: zero-width
#: space, ZWNJ/ZWJ, word joiner, BOM, bidi controls, tag characters...), as inclusive
#: ranges. Fixed here rather than read from ``unicodedata``, whose version follows the
#: interpreter, so the rule is the same for every Python and for the SQL side.
FORMAT_CHARACTER_RANGES: tuple[tuple[int, int], ...] = (
    (0x00AD, 0x00AD), (0x0600, 0x0605), (0x061C, 0x061C), (0x06DD, 0x06DD),
    (0x070F, 0x070F), (0x0890, 0x0891), (0x08E2, 0x08E2), (0x180E, 0x180E),
    (0x200B, 0x200F), (0x202A, 0x202E), (0x2060, 0x2064), (0x2066, 0x206F),
    (0xFEFF, 0xFEFF), (0xFFF9, 0xFFFB), (0x110BD, 0x110BD), (0x110CD, 0x110CD),
    (0x13430, 0x1343F), (0x1BCA0, 0x1BCA3), (0x1D173, 0x1D17A), (0xE0001, 0xE0001),
    (0xE0020, 0xE007F),
)
_FORMAT_CHARACTERS = frozenset(
    chr(code) for first, last in FORMAT_CHARACTER_RANGES for code in range(first, last + 1))
_INVISIBLE = WHITE_SPACE | _FORMAT_CHARACTERS


#: Code points no name-like value may hold (kind, operation key, correlation id; the SQL
#: functions hold owners, actors and reasons to it too), as inclusive ranges: control
#: characters (Unicode Cc: tab, newline, carriage return, escape, NEL...), the format
#: characters above (invisible ones, and the bidirectional controls that reorder what a
#: reader sees) and the line and paragraph separators. Such values are written as they
#: are into log lines, metric dimensions, the dashboard and the command line's tables,
#: where a newline starts a forged line and a right-to-left override shows text in
#: another order. ``app.character_problem`` spells out the same set.
UNSAFE_CHARACTER_RANGES: tuple[tuple[int, int], ...] = (
    (0x0000, 0x001F), (0x007F, 0x009F), *FORMAT_CHARACTER_RANGES, (0x2028, 0x2029),
)
_UNSAFE_CHARACTERS = frozenset(
    chr(code) for first, last in UNSAFE_CHARACTER_RANGES for code in range(first, last + 1))


def character_problem(text: str) -> str | None:
    """Why ``text`` may not name a kind, an operation key or a correlation id, or None.

    The message is the SQL contract's (``app.character_problem``), naming the first
    refused character by code point and its position, counted from 1:

    >>> character_problem("send_receipt"), character_problem("報告")
    (None, None)
    >>> character_problem("send\\nreceipt").partition("(found ")[2]
    'U+000A at character 5; remove it)'
    """
    if _UNSAFE_CHARACTERS.isdisjoint(text):
        return None
    position, char = next((i, c) for i, c in enumerate(text, 1) if c in _UNSAFE_CHARACTERS)
    return ("must not contain control, format (invisible or bidirectional) or line separator "
            f"characters (found U+{ord(char):04X} at character {position}; remove it)")


def is_blank(text: str) -> bool:
    """Whether ``text`` shows nothing: empty, or only White_Space and format characters.

    A kind or operation key made of a tab or a zero-width space looks empty in every
    listing and cannot be told apart from another one; it is refused like an empty one.
    """
    return _INVISIBLE.issuperset(text)


def blank_problem(text: str) -> str | None:
    """Why ``text`` cannot name a kind or an operation key, or None when it can."""
    if not is_blank(text):
        return None
    if not text:
        return "must not be empty"
    shown = ", ".join(describe_code_point(char) for char in dict.fromkeys(text[:20]))
    return ("must not be blank: it holds only white space or invisible format characters "
            f"({shown}); use at least one visible character")


def nesting_depth(value: Any) -> int:
    """Levels below ``value`` (0 for a scalar), without recursion, so any depth is safe."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, level = stack.pop()
        deepest = max(deepest, level)
        if isinstance(item, dict):
            stack.extend((child, level + 1) for child in item.values())
        elif isinstance(item, list | tuple):
            stack.extend((child, level + 1) for child in item)
    return deepest


def json_size(value: Any) -> int:
    """Bytes of ``value`` as strict JSON text, the way PostgreSQL prints jsonb.

    Raises ValueError or TypeError when the value is not strict JSON (NaN, sets, ...),
    RecursionError when it nests deeper than the interpreter's stack.
    """
    return len(json.dumps(value, allow_nan=False, ensure_ascii=False).encode("utf-8"))


# A path into a document, built as linked pairs (parent, key) so that walking costs
# one small tuple per value and the text is only made for a value that is refused.
_Path = tuple[Any, str | int] | None


def _path_text(path: _Path) -> str:
    keys: list[str | int] = []
    while path is not None:
        path, key = path
        keys.append(key)
    text = "$"
    for key in reversed(keys):
        if isinstance(key, int):
            text += f"[{key}]"
        elif key.isidentifier():
            text += f".{key}"
        else:  # quoted, and ASCII: a key may hold lone surrogates, which no message may
            text += f"[{json.dumps(key)}]"
    return text


def _integer_problem(value: int) -> str | None:
    if _SMALLEST_INT <= value <= _LARGEST_INT:
        return None
    digits = int(value.bit_length() * _LOG10_2) + 1
    sign = " and a minus sign" if value < 0 else ""
    return (f"an integer of about {digits} digits{sign}; a JSON number may have at most "
            f"{MAX_NUMBER_CHARS} characters (a worker could not read a much longer one "
            "back). Send a long number as a string")


def _key_problem(key: Any) -> str | None:
    if isinstance(key, str):
        return NUL_PROBLEM if "\x00" in key else None
    if isinstance(key, int) and not isinstance(key, bool):
        problem = _integer_problem(key)
        return None if problem is None else f"is {problem}"
    return None


def _key_text(key: Any) -> str:
    """A key as it appears in a path (json.dumps writes int, float, bool and None keys
    as text; it refuses others, which json_size reports)."""
    if isinstance(key, str):
        return key
    if isinstance(key, int | float) or key is None:
        return json.dumps(key)
    return f"<{type(key).__name__}>"


def storage_problem(value: Any) -> str | None:
    """Why ``value`` cannot be stored as JSON and read back by a worker, or None.

    Looks at every value without recursion, in document order, and names the first
    problem with its path (``$.order.lines[3]``): a NUL character in a string or a key,
    a NaN or infinite float (``json.dumps`` writes ``NaN``, which PostgreSQL refuses
    for the whole statement), or an integer longer than :data:`MAX_NUMBER_CHARS`.
    Other types are left to :func:`json_size`, which refuses what is not JSON.
    """
    stack: list[tuple[Any, _Path]] = [(value, None)]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return f"{_path_text(path)}: {NUL_PROBLEM}"
        elif isinstance(item, bool) or item is None:
            continue
        elif isinstance(item, int):
            problem = _integer_problem(item)
            if problem is not None:
                return f"{_path_text(path)}: {problem}"
        elif isinstance(item, float):
            if not math.isfinite(item):
                return (f"{_path_text(path)}: {item!r} is not a JSON number (JSON has no NaN "
                        "or Infinity); send null or a string instead")
        elif isinstance(item, dict):
            children: list[tuple[Any, _Path]] = []
            for key, child in item.items():
                problem = _key_problem(key)
                if problem is not None:
                    return f"{_path_text(path)}: a key {problem}"
                children.append((child, (path, _key_text(key))))
            stack.extend(reversed(children))
        elif isinstance(item, list | tuple):
            stack.extend(reversed([(child, (path, index)) for index, child in enumerate(item)]))
    return None


def describe_code_point(char: str) -> str:
    """``U+200B ZERO WIDTH SPACE``: how to name an invisible character in a message."""
    return f"U+{ord(char):04X} {unicodedata.name(char, 'unnamed')}"
