"""Opaque keyset cursors: ``base64url("<kind>:<last key>")``. A cursor of another list is refused."""

from __future__ import annotations

import base64
import binascii

from dlts.errors import InvalidInput
from dlts.strict import whole_number


def encode(kind: str, key: int | str) -> str:
    return base64.urlsafe_b64encode(f"{kind}:{key}".encode()).decode().rstrip("=")


def decode(kind: str, cursor: str | None) -> str | None:
    if not cursor:
        return None
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        found, value = raw.split(":", 1)
        if found != kind or not value:
            raise ValueError
        return value
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise InvalidInput("cursor is not one this list returned; start again without it.",
                           code="invalid_cursor", details={"field": "cursor"}) from None


def decode_int(kind: str, cursor: str | None) -> int | None:
    value = decode(kind, cursor)
    if value is None:
        return None
    return whole_number(value, "cursor", message="cursor is not one this list returned; start again without it.",
                        code="invalid_cursor")
