"""``transaction.rowcount``: the rows an UPDATE or DELETE matched, read from the database's own count."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from dlts.models import User
from dlts.services import admin
from dlts.services.transaction import rowcount


def test_the_rows_an_update_and_a_delete_matched(sessions):
    with sessions() as s:
        for name in ("ann", "ben", "cy"):
            admin.add_user(s, name)
        s.commit()
        changed = s.execute(sa.update(User).where(User.name.in_(["ann", "ben"])).values(email="someone@example.org")
                            .execution_options(synchronize_session=False))
        assert rowcount(changed) == 2
        assert rowcount(s.execute(sa.delete(User).where(User.name == "nobody"))) == 0
        assert rowcount(s.execute(sa.delete(User).where(User.name == "cy"))) == 1
        s.commit()
        assert s.scalars(sa.select(User.name).where(User.name.in_(["ann", "ben", "cy"])).order_by(User.name)).all() == ["ann", "ben"]


def test_a_query_result_is_refused(sessions):
    with sessions() as s, pytest.raises(TypeError, match="not the result of an UPDATE or DELETE"):
        rowcount(s.execute(sa.select(User.id)))
