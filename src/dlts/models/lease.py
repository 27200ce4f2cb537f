"""The managers' lease: one row per leased role (``managers``) naming the one process that acts.

``expires_at`` and the other moments are epoch seconds on the *database's* clock (every comparison
is made inside the database, so control nodes whose clocks differ still agree). ``token`` grows by
one at every change of holder: the fencing token each of the holder's writes is checked against.
``fenced_commits`` counts the holder's fenced commits: the check that adds one is a real write, so
the server bounds how long a frozen holder keeps the row locked (``dlts.managers.lease``).
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from dlts.models.base import Base


class ManagersLease(Base):
    __tablename__ = "managers_lease"

    name: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    holder: Mapped[str] = mapped_column(sa.String(255), default="")  # "host:pid" by default
    token: Mapped[int] = mapped_column(sa.BigInteger, default=0)
    expires_at: Mapped[float] = mapped_column(sa.Double, default=0.0)
    acquired_at: Mapped[float] = mapped_column(sa.Double, default=0.0)
    renewed_at: Mapped[float] = mapped_column(sa.Double, default=0.0)
    fenced_commits: Mapped[int] = mapped_column(sa.BigInteger, default=0, server_default="0")
