"""``dlts.services.transaction``: the one unit of work, as use-cases and control loops use it.

Each test reads the outcome back through a second session, so what counts is what was committed."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from dlts.errors import WrongState
from dlts.models import User
from dlts.services.transaction import discard, step, transaction


def _names(sessions) -> list[str]:
    with sessions() as other:
        return list(other.scalars(sa.select(User.name).where(User.name.like("tx-%")).order_by(User.name)))


def _user(name: str) -> User:
    return User(name=name)


def test_a_block_commits_on_success_and_rolls_back_on_a_refusal(sessions):
    with sessions() as s:
        with transaction(s):
            s.add(_user("tx-kept"))
        with pytest.raises(WrongState), transaction(s):
            s.add(_user("tx-refused"))
            s.flush()
            raise WrongState("no")
    assert _names(sessions) == ["tx-kept"]


def test_only_the_outermost_block_commits_and_an_inner_refusal_caught_inside_keeps_the_rest(sessions):
    with sessions() as s:
        with transaction(s):
            s.add(_user("tx-outer"))
            with transaction(s):
                s.add(_user("tx-inner"))
            assert _names(sessions) == []  # the inner block's end committed nothing
        assert _names(sessions) == ["tx-inner", "tx-outer"]


def test_a_step_ends_its_transaction_even_when_it_only_read(sessions):
    with sessions() as s:
        with transaction(s):
            s.scalar(sa.select(sa.func.count(User.id)))
            assert s.in_transaction()
        assert s.in_transaction()  # a read-only block costs no COMMIT: the transaction stays open
        s.close()
        with step(s):
            s.scalar(sa.select(sa.func.count(User.id)))
        assert not s.in_transaction()


def test_discard_ends_the_step_with_a_rollback_and_raises_nothing(sessions):
    with sessions() as s:
        with step(s):
            s.add(_user("tx-lost-race"))
            s.flush()
            discard(s)
        with step(s):
            s.add(_user("tx-next-step"))
    assert _names(sessions) == ["tx-next-step"]  # the flag ended with its step


def test_discard_outside_a_block_is_a_mistake(sessions):
    with sessions() as s, pytest.raises(RuntimeError):
        discard(s)


def test_a_commit_that_fails_rolls_back_and_the_session_goes_on(sessions):
    with sessions() as s:
        with step(s):
            s.add(_user("tx-twice"))
        with pytest.raises(IntegrityError), step(s):
            s.add(_user("tx-twice"))  # the duplicate is only found by the COMMIT's flush
        with step(s):  # usable again: no "transaction has been rolled back" error
            s.add(_user("tx-after"))
    assert _names(sessions) == ["tx-after", "tx-twice"]
