"""Strict parsing of what people and agents send: whole numbers, and JSON bodies.

``whole_number`` takes ASCII digits only, in a bounded range. Python's ``str.isdigit`` is true for
``"²"`` (which ``int`` then refuses) and ``int`` itself takes ``"١٢"``, ``" 7"`` and ``"7_0"``; an id
beyond 2**63 overflows the database's integer. Every number a user types into a form, a query string
or a cursor goes through here and fails as ``InvalidInput`` naming its field.

``loads_json`` parses a request body the way the database will accept it. MariaDB's JSON columns
carry a ``json_valid`` CHECK that refuses ``NaN``/``Infinity`` (which Python's ``json`` reads),
numbers beyond a double (``1e400`` reads as infinity), lone UTF-16 surrogates (``"\\ud800"``) and
nesting deeper than 32; SQLite stores them and answers invalid JSON later. They are refused here, at
the door, with the path of the value at fault (``metrics.gpus.0.utilization_ratio``).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from dlts.errors import InvalidInput

MAX_ID = 2**62  # database ids (BIGINT) stay far below this; larger ones are not ours
# Containers inside one another in a request body (the body itself is level 1). MariaDB refuses
# stored documents deeper than 32; every stored document is at most as deep as the body it came from.
MAX_JSON_DEPTH = 16
# Integers in JSON bodies: int64 and uint64 counters fit, longer digit strings are refused.
MIN_JSON_INT = -(2**63)
MAX_JSON_INT = 2**64 - 1

_DIGITS = re.compile(r"[0-9]{1,20}")
_DECIMAL = re.compile(r"[0-9]{1,20}(\.[0-9]{1,20})?|\.[0-9]{1,20}")
_SURROGATE = re.compile("[\ud800-\udfff]")


def whole_number(text: str | None, field: str, *, min_value: int = 0, max_value: int = MAX_ID,
                 message: str | None = None, code: str | None = None) -> int:
    """``text`` as an int of ASCII digits only (no sign, blank or ``_``) within [min_value, max_value]."""
    value = int(text) if isinstance(text, str) and _DIGITS.fullmatch(text) else None
    if value is None or not min_value <= value <= max_value:
        raise InvalidInput(message or f"{field} must be a whole number between {min_value} and {max_value}.",
                           code=code, details={"field": field})
    return value


def whole_number_or_none(text: str | None, field: str, **kwargs: Any) -> int | None:
    """A form's box: None when missing or blank, else ``whole_number`` of it without surrounding blanks."""
    if text is None or (isinstance(text, str) and not text.strip()):
        return None
    return whole_number(text.strip(), field, **kwargs)


def is_whole_number(text: Any, *, max_value: int = MAX_ID) -> bool:
    return isinstance(text, str) and bool(_DIGITS.fullmatch(text)) and int(text) <= max_value


def decimal(text: str) -> float:
    """A typed decimal ("2", "0.5", ".5") of ASCII digits as a float; ValueError for anything else
    (float() itself takes "١", "1_0", "nan", "inf" and "1e400")."""
    if not isinstance(text, str) or not _DECIMAL.fullmatch(text.strip()):
        raise ValueError(text)
    return float(text.strip())


# -- JSON -------------------------------------------------------------------------------------------

class _Refused:
    """A value the scanner met that the database would refuse; reported with its path after parsing."""

    __slots__ = ("why",)

    def __init__(self, why: str):
        self.why = why


def _constant(name: str) -> _Refused:
    return _Refused(f"{name} is not a JSON number; send a finite number or null")


def _float(text: str) -> float | _Refused:
    value = float(text)
    if not math.isfinite(value):
        return _Refused(f"{text[:30]} is out of range for a number (at most about 1.8e308)")
    return value


def _int(text: str) -> int | _Refused:
    if len(text) > 21:
        return _Refused(f"an integer of {len(text)} digits is out of range ({MIN_JSON_INT} to {MAX_JSON_INT})")
    value = int(text)
    if not MIN_JSON_INT <= value <= MAX_JSON_INT:
        return _Refused(f"{text} is out of range for an integer ({MIN_JSON_INT} to {MAX_JSON_INT})")
    return value


def _refuse(path: list[str | int], why: str) -> InvalidInput:
    field = ".".join(str(p) for p in path) or "body"
    return InvalidInput(f"{field}: {why}.", code="invalid_json", details={"field": field})


def loads_json(data: bytes | str, *, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Parse a JSON document, refusing what the database cannot store (see the module docstring)."""
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
        value = json.loads(text, parse_constant=_constant, parse_float=_float, parse_int=_int)
    except RecursionError:
        raise _refuse([], f"nested too deeply; at most {max_depth} levels of objects and arrays") from None
    except UnicodeDecodeError:
        raise InvalidInput("The request body is not UTF-8; send JSON encoded as UTF-8.", code="invalid_json") from None
    except ValueError as exc:  # json.JSONDecodeError included
        where = f" at line {exc.lineno} column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else ""
        raise InvalidInput(f"The request body is not valid JSON{where}; send Content-Type: application/json with a "
                           "JSON object.", code="invalid_json") from None
    check_json(value, max_depth=max_depth)
    return value


def check_json(value: Any, *, max_depth: int = MAX_JSON_DEPTH) -> None:
    """Walk a parsed document (without recursion): depth, lone surrogates, refused numbers."""
    stack: list[tuple[Any, list[str | int], int]] = [(value, [], 1)]
    while stack:
        item, path, depth = stack.pop()
        if isinstance(item, _Refused):
            raise _refuse(path, item.why)
        if isinstance(item, str):
            if _SURROGATE.search(item):
                raise _refuse(path, "contains a lone UTF-16 surrogate (\\ud800-\\udfff); send valid Unicode")
            continue
        if isinstance(item, float) and not math.isfinite(item):
            raise _refuse(path, "is not a finite number")
        if isinstance(item, (dict, list)):
            if depth > max_depth:
                raise _refuse(path, f"nested too deeply; at most {max_depth} levels of objects and arrays")
            if isinstance(item, dict):
                for key, child in item.items():
                    if isinstance(key, str) and _SURROGATE.search(key):
                        raise _refuse(path, "has a key with a lone UTF-16 surrogate (\\ud800-\\udfff); send valid Unicode")
                    stack.append((child, [*path, key], depth + 1))
            else:
                stack.extend((child, [*path, i], depth + 1) for i, child in enumerate(item))


def dumps_for_db(value: Any) -> str:
    """The engines' JSON serializer: NaN and infinities raise instead of being written as invalid JSON."""
    return json.dumps(value, allow_nan=False)
