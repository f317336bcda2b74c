"""Output: rich tables for people, JSON for scripts, colour only on a terminal.

rich leaves colour out when stdout is not a terminal and honours NO_COLOR; --no-color
turns it off on a terminal too. With --json every command prints one JSON document
on stdout and nothing else.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from datetime import datetime, timedelta
from enum import Enum
from typing import Any
from uuid import UUID

from leaseq.base.decoding import UndecodableJson
from rich.console import Console
from rich.markup import escape
from rich.table import Table


def json_default(value: Any) -> Any:
    """JSON for the values rows hold: a stored JSON value Python cannot decode becomes
    ``{"undecodable": true, "reason": ..., "prefix": ..., "length": ...}``."""
    if isinstance(value, UndecodableJson):
        return value.as_document()
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, Enum):
        return value.value
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def age(value: timedelta | None) -> str:
    """A short human duration: 850ms, 12.3s, 4m05s, 2h10m, 3d04h."""
    if value is None:
        return "-"
    seconds = value.total_seconds()
    if seconds < 0:
        return "-" + age(-value)
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, sec = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{sec:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours:02d}h"


def when(value: datetime | None) -> str:
    if value is None:
        return "-"
    return value.astimezone().strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def plain(text: str) -> str:
    """``text`` shown as it is in a table: stored text (a kind, a key, a payload) may
    hold what rich would read as markup, and ``[/x]`` would make the print fail."""
    return escape(text)


def compact(value: Any, limit: int = 120) -> str:
    """A stored JSON value on one line, cut at ``limit`` characters, safe to print in a
    table; an undecodable one says so, with its reason and first characters."""
    if value is None:
        return ""
    if isinstance(value, UndecodableJson):
        text = value.describe()
    else:
        text = json.dumps(value, default=json_default, separators=(", ", ": "))
    return plain(text if len(text) <= limit else text[: limit - 1] + "…")


STATE_STYLE = {
    "pending": "cyan",
    "running": "blue",
    "retry_wait": "yellow",
    "succeeded": "green",
    "dead": "bold red",
    "cancelled": "magenta",
}


def styled_state(state: str) -> str:
    style = STATE_STYLE.get(state)
    return f"[{style}]{state}[/]" if style else state


class Ui:
    """Where a command's output goes, and in which form."""

    def __init__(self, *, json_output: bool = False, no_color: bool = False,
                 verbose: bool = False) -> None:
        self.json_output = json_output
        self.verbose = verbose
        terminal = sys.stdout.isatty()
        self.out = Console(
            no_color=True if no_color else None,
            highlight=False,
            soft_wrap=not terminal,
            width=None if terminal else 200,
        )
        self.err = Console(stderr=True, no_color=True if no_color else None, highlight=False,
                           soft_wrap=not sys.stderr.isatty())

    @property
    def interactive(self) -> bool:
        """A person is watching: progress bars make sense."""
        return self.out.is_terminal and not self.json_output

    def emit(self, data: Any, render: Callable[[Console], None]) -> None:
        if self.json_output:
            sys.stdout.write(json.dumps(data, default=json_default, indent=2) + "\n")
            sys.stdout.flush()
        else:
            render(self.out)

    def note(self, message: str) -> None:
        """A line for people on stderr, never mixed into --json output."""
        if not self.json_output:
            self.err.print(message)


def table(*columns: str, title: str | None = None) -> Table:
    made = Table(title=title, title_justify="left", header_style="bold", show_edge=False,
                 pad_edge=False)
    for column in columns:
        made.add_column(column, overflow="fold")
    return made
