"""A VC's scheduling settings (fair_share, fair_share_max_wait_s, limit_weight, min_runtime_s,
max_reclaim_delay_s, max_preemptions) change at runtime: VC admins and cluster admins set them with
PATCH /vcs/NAME, null clears one back to its default, GET shows each value in effect with its
source, and the job manager's snapshot (built from the database on every tick) takes the VC row's
value, else dlts.yaml's vc_scheduling entry, else the cluster's."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from dlts.config import VcScheduling
from dlts.errors import InvalidInput
from dlts.jobmanager.snapshot import load_snapshot
from dlts.models import VcEvent
from dlts.services import vcs as vc_service

from .helpers import assert_envelope, principal

DAY_S = 86400
FIELDS = ("fair_share", "fair_share_max_wait_s", "limit_weight", "min_runtime_s", "max_reclaim_delay_s", "max_preemptions")


@pytest.fixture
def settings(settings):
    """The cluster: fair share on with no bound on a job's wait, max_reclaim_delay_s 3600; dlts.yaml's
    vc_scheduling gives vision fair_share_max_wait_s a day, limit_weight 0.25, min_runtime_s 600 and
    max_preemptions 2 (nlp has no entry)."""
    return settings.model_copy(update={
        "fair_share": True, "fair_share_max_wait_s": None, "min_runtime_s": 0.0, "max_reclaim_delay_s": 3600.0,
        "max_preemptions": 0, "limit_weight": 0.0,
        "vc_scheduling": {"vision": VcScheduling(fair_share_max_wait_s=DAY_S, limit_weight=0.25, min_runtime_s=600,
                                                 max_preemptions=2)}})


def patch(client, world, user: str, body: dict, vc: str = "vision"):
    return client.patch(f"/api/v1/vcs/{vc}", json=body, headers=world.auth(user))


def effective(vc: dict) -> dict:
    return {key: (vc[key], vc[f"{key}_source"]) for key in FIELDS}


def test_get_shows_each_setting_in_effect_and_where_it_comes_from(client, world):
    vision = client.get("/api/v1/vcs/vision", headers=world.auth("alice")).get_json()
    assert effective(vision) == {"fair_share": (True, "default"), "fair_share_max_wait_s": (DAY_S, "config"),
                                 "limit_weight": (0.25, "config"), "min_runtime_s": (600, "config"),
                                 "max_reclaim_delay_s": (3600, "default"),
                                 "max_preemptions": (2, "config")}
    nlp = client.get("/api/v1/vcs/nlp", headers=world.auth("admin")).get_json()
    assert effective(nlp) == {"fair_share": (True, "default"), "fair_share_max_wait_s": (None, "default"),
                              "limit_weight": (0, "default"), "min_runtime_s": (0, "default"), "max_reclaim_delay_s": (3600, "default"),
                              "max_preemptions": (0, "default")}


def test_a_vc_admin_sets_them_and_each_change_is_a_vc_event(client, world, sessions):
    r = patch(client, world, "vcadmin", {"fair_share": False, "fair_share_max_wait_s": 3600, "min_runtime_s": 1800,
                                         "max_reclaim_delay_s": 7200, "max_preemptions": 5, "limit_weight": 1.5})
    assert r.status_code == 200, r.get_json()
    assert effective(r.get_json()) == {"fair_share": (False, "vc"), "fair_share_max_wait_s": (3600, "vc"),
                                       "limit_weight": (1.5, "vc"), "min_runtime_s": (1800, "vc"), "max_reclaim_delay_s": (7200, "vc"),
                                       "max_preemptions": (5, "vc")}
    assert effective(client.get("/api/v1/vcs/vision", headers=world.auth("bob")).get_json()) == effective(r.get_json())
    with sessions() as s:
        events = {e.field: (e.old_value, e.new_value, e.actor)
                  for e in s.scalars(sa.select(VcEvent).where(VcEvent.vc == "vision", VcEvent.field.in_(FIELDS)))}
    assert events == {"fair_share": (None, False, "vcadmin"), "fair_share_max_wait_s": (None, 3600, "vcadmin"),
                      "limit_weight": (None, 1.5, "vcadmin"),
                      "min_runtime_s": (None, 1800, "vcadmin"),
                      "max_reclaim_delay_s": (None, 7200, "vcadmin"), "max_preemptions": (None, 5, "vcadmin")}
    listed = client.get("/api/v1/vcs/vision/events", headers=world.auth("vcadmin")).get_json()["items"]
    assert {e["field"] for e in listed} >= set(FIELDS)


def test_a_cluster_admin_sets_them_on_any_vc(client, world):
    r = patch(client, world, "admin", {"max_preemptions": 1000, "min_runtime_s": 30 * DAY_S,
                                       "fair_share_max_wait_s": 30 * DAY_S, "limit_weight": 10}, vc="nlp")
    assert r.status_code == 200, r.get_json()
    assert (r.get_json()["max_preemptions"], r.get_json()["min_runtime_s"]) == (1000, 30 * DAY_S)
    assert (r.get_json()["fair_share_max_wait_s"], r.get_json()["fair_share_max_wait_s_source"]) == (30 * DAY_S, "vc")
    assert (r.get_json()["limit_weight"], r.get_json()["limit_weight_source"]) == (10, "vc")


@pytest.mark.parametrize("user, status", [("alice", 403), ("bob", 403), ("carol", 404)])
def test_members_may_not_change_them_and_strangers_do_not_see_the_vc(client, world, user, status):
    assert_envelope(patch(client, world, user, {"fair_share": False}), status)
    vision = client.get("/api/v1/vcs/vision", headers=world.auth("vcadmin")).get_json()
    assert vision["fair_share_source"] == "default"


@pytest.mark.parametrize("user, status", [("alice", 403), ("bob", 403), ("carol", 404)])
def test_members_may_not_bound_the_fair_share_wait(client, world, user, status):
    assert_envelope(patch(client, world, user, {"fair_share_max_wait_s": 60}), status)
    vision = client.get("/api/v1/vcs/vision", headers=world.auth("vcadmin")).get_json()
    assert (vision["fair_share_max_wait_s"], vision["fair_share_max_wait_s_source"]) == (DAY_S, "config")


@pytest.mark.parametrize("field, value", [
    ("fair_share", "yes"), ("fair_share", 1), ("fair_share", "true"),
    ("min_runtime_s", -1), ("min_runtime_s", 30 * DAY_S + 1), ("min_runtime_s", 1.5), ("min_runtime_s", "60"),
    ("min_runtime_s", True), ("max_reclaim_delay_s", -5), ("max_reclaim_delay_s", 10**12),
    ("fair_share_max_wait_s", -1), ("fair_share_max_wait_s", 30 * DAY_S + 1), ("fair_share_max_wait_s", 1.5),
    ("fair_share_max_wait_s", "3600"), ("fair_share_max_wait_s", False),
    ("max_preemptions", 1001), ("max_preemptions", -1), ("max_preemptions", [3]),
    ("limit_weight", -0.1), ("limit_weight", 10.5), ("limit_weight", True), ("limit_weight", "a lot"),
    ("limit_weight", [0.25]),
])
def test_a_bad_value_is_refused_naming_the_field(client, world, field, value):
    error = assert_envelope(patch(client, world, "vcadmin", {field: value}), 400, "invalid_input")
    assert field in error["details"]["fields"] and error["message"].startswith(field), error
    assert client.get("/api/v1/vcs/vision", headers=world.auth("vcadmin")).get_json()[f"{field}_source"] != "vc"


@pytest.mark.parametrize("field, value", [("fair_share", 1), ("min_runtime_s", 30 * DAY_S + 1), ("min_runtime_s", 2.5),
                                          ("max_reclaim_delay_s", -1), ("max_preemptions", 1001),
                                          ("max_preemptions", True), ("fair_share_max_wait_s", -1),
                                          ("fair_share_max_wait_s", 30 * DAY_S + 1), ("fair_share_max_wait_s", 0.5),
                                          ("fair_share_max_wait_s", True), ("limit_weight", -1), ("limit_weight", 11),
                                          ("limit_weight", True), ("limit_weight", float("nan")),
                                          ("limit_weight", "0.25")])
def test_the_service_refuses_what_the_schema_does(sessions, world, settings, field, value):
    """The portal calls the service directly: it names the field too."""
    with sessions() as s, pytest.raises(InvalidInput) as err:
        vc_service.update_vc(s, settings, principal(s, "vcadmin"), "vision", {field: value})
    assert err.value.details["field"] == field


def test_null_clears_a_setting_back_to_its_default(client, world, sessions):
    patch(client, world, "vcadmin", {"fair_share": False, "fair_share_max_wait_s": 0, "min_runtime_s": 60,
                                     "max_reclaim_delay_s": 0, "max_preemptions": 9, "limit_weight": 0})
    r = patch(client, world, "vcadmin", {"fair_share": None, "fair_share_max_wait_s": None, "min_runtime_s": None,
                                         "max_reclaim_delay_s": None, "max_preemptions": None, "limit_weight": None})
    assert r.status_code == 200, r.get_json()
    assert effective(r.get_json()) == {"fair_share": (True, "default"), "fair_share_max_wait_s": (DAY_S, "config"),
                                       "limit_weight": (0.25, "config"), "min_runtime_s": (600, "config"),
                                       "max_reclaim_delay_s": (3600, "default"),
                                       "max_preemptions": (2, "config")}
    r = patch(client, world, "admin", {"fair_share_max_wait_s": 0}, vc="nlp")
    assert (r.get_json()["fair_share_max_wait_s"], r.get_json()["fair_share_max_wait_s_source"]) == (0, "vc")
    r = patch(client, world, "admin", {"fair_share_max_wait_s": None}, vc="nlp")
    assert (r.get_json()["fair_share_max_wait_s"], r.get_json()["fair_share_max_wait_s_source"]) == (None, "default")
    with sessions() as s:
        last = s.scalars(sa.select(VcEvent).where(VcEvent.field == "max_reclaim_delay_s").order_by(VcEvent.id.desc())).first()
    assert (last.old_value, last.new_value) == (0, None)  # 0 is a value, not "unset"


def test_the_snapshot_takes_the_vc_row_then_vc_scheduling_then_the_cluster_default(client, world, sessions, settings):
    with sessions() as s:
        before = load_snapshot(s, settings).vcs
    assert (before["vision"].min_runtime_s, before["vision"].max_preemptions) == (600, 2)  # vc_scheduling
    assert (before["vision"].max_reclaim_delay_s, before["vision"].fair_share) == (3600, True)  # the cluster's
    assert (before["nlp"].min_runtime_s, before["nlp"].max_preemptions) == (0, 0)
    assert (before["vision"].fair_share_max_wait_s, before["nlp"].fair_share_max_wait_s) == (DAY_S, None)
    assert (before["vision"].limit_weight, before["nlp"].limit_weight) == (0.25, 0.0)

    assert patch(client, world, "vcadmin", {"min_runtime_s": 1200, "max_reclaim_delay_s": 60, "fair_share": False,
                                            "fair_share_max_wait_s": 300, "limit_weight": 1}).status_code == 200
    with sessions() as s:  # the next tick's snapshot: no restart
        after = load_snapshot(s, settings).vcs
    assert (after["vision"].fair_share_max_wait_s, after["vision"].limit_weight) == (300.0, 1.0)
    assert (after["vision"].min_runtime_s, after["vision"].max_reclaim_delay_s, after["vision"].fair_share) == (1200, 60, False)
    assert after["vision"].max_preemptions == 2  # not set on the VC: still vc_scheduling's
    assert after["nlp"] == before["nlp"]

    assert patch(client, world, "vcadmin", {"min_runtime_s": None, "fair_share_max_wait_s": None,
                                            "limit_weight": None}).status_code == 200
    with sessions() as s:
        cleared = load_snapshot(s, settings).vcs
    assert (cleared["vision"].min_runtime_s, cleared["vision"].fair_share_max_wait_s) == (600, DAY_S)
    assert cleared["vision"].limit_weight == 0.25


def test_fair_share_stays_off_when_the_half_life_is_zero(client, world, sessions, settings):
    assert patch(client, world, "vcadmin", {"fair_share": True}).status_code == 200
    off = settings.model_copy(update={"fair_share_half_life_h": 0.0})
    with sessions() as s:
        snap = load_snapshot(s, off)
        view = vc_service.get_vc(s, off, principal(s, "vcadmin"), "vision")
    assert snap.vcs["vision"].fair_share is False and snap.fair_share_usage == {}
    assert (view.fair_share, view.fair_share_source) == (False, "config")
