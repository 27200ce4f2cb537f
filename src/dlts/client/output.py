"""Output for people: aligned tables, relative times and durations, colour only on a terminal."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import sys

import click

STATUS_COLOURS = {"running": "green", "finished": "green", "queued": "yellow", "scheduling": "yellow",
                  "unapproved": "magenta", "paused": "cyan", "pausing": "cyan", "failed": "red", "error": "red",
                  "killed": "red", "killing": "red"}


def colour_on(stream=None) -> bool:
    stream = stream or sys.stdout
    return bool(getattr(stream, "isatty", lambda: False)()) and not os.environ.get("NO_COLOR")


def status_text(status: str | None, colour: bool) -> str:
    text = status or "-"
    if colour and status in STATUS_COLOURS:
        return click.style(text, fg=STATUS_COLOURS[status])
    return text


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _width(cell: str) -> int:
    return len(_ANSI.sub("", cell))


def table(headers: list[str], rows: list[list[str]], right: set[int] | frozenset[int] = frozenset()) -> str:
    """Columns padded to their widest cell; ``right`` are the indices aligned right (numbers)."""
    cells = [headers] + [["-" if c in (None, "") else str(c) for c in row] for row in rows]
    widths = [max(_width(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for row in cells:
        out = []
        for i, cell in enumerate(row):
            pad = " " * (widths[i] - _width(cell))
            last = i == len(row) - 1
            out.append(pad + cell if i in right else (cell if last else cell + pad))
        lines.append("  ".join(out).rstrip())
    return "\n".join(lines)


def parse_time(value: str | None) -> dt.datetime | None:
    if not value:
        return None
    try:
        parsed = dt.datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)


def duration(seconds: float | None) -> str:
    """``3d4h``, ``2h05m``, ``4m10s``, ``12s``."""
    if seconds is None:
        return "-"
    s = int(max(0, seconds))
    days, s = divmod(s, 86400)
    hours, s = divmod(s, 3600)
    minutes, s = divmod(s, 60)
    if days:
        return f"{days}d{hours}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{s:02d}s"
    return f"{s}s"


def relative(value: str | None, now: dt.datetime | None = None) -> str:
    """``5m ago``, ``in 2h05m``, ``-``."""
    when = parse_time(value)
    if when is None:
        return "-"
    delta = (when - (now or dt.datetime.now(dt.UTC))).total_seconds()
    if abs(delta) < 1:
        return "now"
    return f"in {duration(delta)}" if delta > 0 else f"{duration(-delta)} ago"


def echo_json(value) -> None:
    click.echo(json.dumps(value, indent=2, sort_keys=True, default=str))


def parse_duration(text: str) -> int:
    """``90``, ``90s``, ``45m``, ``2h``, ``1d``, ``1h30m`` -> seconds; ValueError otherwise."""
    raw = text.strip().lower()
    if raw.isascii() and raw.isdigit():
        return int(raw)
    parts = re.fullmatch(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?", raw)
    if not raw or parts is None or not any(parts.groups()):
        raise ValueError(f"{text!r} is not a duration like 90s, 45m, 2h, 1d or 1h30m")
    d, h, m, s = (int(g or 0) for g in parts.groups())
    return d * 86400 + h * 3600 + m * 60 + s


def size(value: float | None) -> str:
    """``2.0 GiB``, ``512 MiB``, ``900 B``."""
    if value is None:
        return "-"
    amount = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if amount < 1024 or unit == "TiB":
            return f"{amount:.0f} {unit}" if unit == "B" or amount >= 100 else f"{amount:.1f} {unit}"
        amount /= 1024
    return f"{amount:.1f} PiB"
