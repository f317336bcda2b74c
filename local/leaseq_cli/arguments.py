"""Argument types that turn bad input into one line naming the fix."""

from __future__ import annotations

import argparse
import ipaddress
import json
import re
import uuid
from datetime import timedelta
from typing import Any

from leaseq.base.limits import MAX_PRIORITY, MIN_PRIORITY, queue_name_problem

#: leaseq.base.schedules.SHARED_TENANT, without importing the library for --help.
SHARED_TENANT = uuid.UUID(int=0)

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*$")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800}


def uuid_value(text: str) -> uuid.UUID:
    try:
        return uuid.UUID(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a UUID; use the 36-character form, such as "
            "123e4567-e89b-12d3-a456-426614174000") from None


def duration(text: str) -> timedelta:
    """``90s``, ``15m``, ``12h``, ``30d``, ``2w`` (a bare number is seconds)."""
    match = _DURATION.match(text)
    if match is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a duration; use a number with a unit, such as 90s, 15m, 12h "
            "or 30d")
    return timedelta(seconds=float(match[1]) * _UNITS[match[2] or "s"])


def seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number of seconds, such as 20 or 2.5") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be more than 0 seconds")
    return value


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return value


def priority(text: str) -> int:
    """A job's priority: 1 (least urgent) .. 9 (most urgent)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not MIN_PRIORITY <= value <= MAX_PRIORITY:
        raise argparse.ArgumentTypeError(
            f"{text!r} is outside {MIN_PRIORITY} (least urgent) .. {MAX_PRIORITY} (most urgent)")
    return value


def queue_name(text: str) -> str:
    """A named queue: 1 .. 40 lowercase letters, digits, '-' or '_', starting with a
    letter (the database's rule, checked before anything is sent)."""
    problem = queue_name_problem(text)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return text


def json_object(text: str, *, what: str = "--payload") -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(
            f"{what} is not valid JSON ({exc.msg} at column {exc.colno}); quote it for the "
            """shell, such as '{"to": "ada@example.com"}'""") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(
            f"{what} must be a JSON object, such as '{{\"to\": \"ada@example.com\"}}' "
            f"(got a JSON {_json_type(value)})")
    return value


def _json_type(value: Any) -> str:
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    return "null"


def tunnel_address(text: str) -> tuple[str, int]:
    """``PORT`` or ``ADDRESS:PORT`` (``[ADDRESS]:PORT`` for IPv6) of a local port forward;
    the address is an IP address (libpq's ``hostaddr`` takes no name), 127.0.0.1 unless
    given."""
    address, _, port_text = text.strip().rpartition(":")
    address = address.strip("[]") or "127.0.0.1"
    try:
        port = int(port_text)
        ipaddress.ip_address(address)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a local port forward; give its port, such as 15432, or "
            "ADDRESS:PORT with an IP address, such as 127.0.0.1:15432") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r}: a port is from 1 to 65535")
    return address, port
