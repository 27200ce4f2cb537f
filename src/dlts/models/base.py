"""Declarative base and column helpers shared by every model module.

Timestamps are naive UTC ``datetime`` values with microseconds (DATETIME(6) on MariaDB). A moment
that has not happened is NULL, never 0 or 1970.
"""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa
from sqlalchemy.dialects import mysql
from sqlalchemy.orm import DeclarativeBase

# microsecond timestamps on MariaDB (its DATETIME defaults to whole seconds)
Timestamp = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
# 64-bit ids that autoincrement on SQLite too (SQLite only autoincrements INTEGER PRIMARY KEY)
BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = sa.MetaData(naming_convention=NAMING)


def str_enum(enum_cls: type, length: int = 32) -> sa.Enum:
    """A VARCHAR enum column that stores the member *values* (readable in SQL)."""
    return sa.Enum(enum_cls, native_enum=False, length=length, values_callable=lambda e: [m.value for m in e])


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC).replace(tzinfo=None)


def iso(value: dt.datetime | None) -> str | None:
    """ISO 8601 with a Z for API output; None stays None (never 1970)."""
    if value is None:
        return None
    return value.replace(tzinfo=None).isoformat(timespec="milliseconds") + "Z"
