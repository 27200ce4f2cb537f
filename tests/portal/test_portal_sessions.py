"""Portal sessions and login hardening: where a login may send the browser next, sessions that end
on logout and on a password change, no secret in the cookie, and the cookie's flags."""

from __future__ import annotations

import json
import re
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
import sqlalchemy as sa

from dlts.models import PortalSession
from dlts.portal.core import safe_local_path

NASTY_NEXT = [
    "//evil.example/x",
    "/%09/evil.example/x",          # decodes to a tab, which browsers drop: //evil.example/x
    "/\t/evil.example/x",
    "/\n/evil.example/x",
    "/\r\n/evil.example/x",
    "/%0a/evil.example/x",
    "/%0D%0A/evil.example/x",
    "/\\evil.example/x",            # browsers read a backslash as a slash
    "\\\\evil.example/x",
    "/%5Cevil.example/x",
    "/%2F/evil.example/x",
    "/%2f%2fevil.example/x",
    "/%252F/evil.example/x",        # double-encoded
    "/%25%30%39/evil.example/x",    # %09 spelled with encoded digits
    "/%09?x=1",
    "/\t?x=1",
    "///evil.example/x",
    "https://evil.example/x",
    "http:evil.example",
    "javascript:alert(1)",
    "evil.example/x",
    " /jobs",
    "/ /evil.example",
    "/\x00/evil.example",
    "/%00/evil.example",
    "/\u3000/evil.example",
    "/\uff0f/evil.example",         # a fullwidth solidus
    "",
    "/" + "a" * 5000,
]
GOOD_NEXT = ["/jobs", "/jobs?vc=vision&status=active", "/jobs/3", "/tokens", "/jobs?", "/jobs?name=a%20b",
             "/jobs?next=//x"]


@pytest.mark.parametrize("target", NASTY_NEXT)
def test_a_next_that_could_leave_the_site_is_refused(target):
    assert safe_local_path(target) is None


@pytest.mark.parametrize("target", GOOD_NEXT)
def test_a_path_on_this_site_is_kept(target):
    assert safe_local_path(target) == target


@pytest.mark.parametrize("target", NASTY_NEXT)
def test_login_never_redirects_off_site(anon, passwords, target):
    c = anon()
    c.get("/login")
    response = c.post("/login", {"username": "alice", "password": passwords["alice"], "next": target})
    assert response.status_code == 302
    assert response.headers["Location"] == "/jobs", response.headers["Location"]
    # logged in now: GET /login?next=... redirects at once, through the same check
    response = c.client.get("/login", query_string={"next": target})
    assert response.status_code == 302 and response.headers["Location"] == "/jobs"


def test_login_follows_a_next_on_this_site(anon, passwords):
    c = anon()
    c.get("/login")
    response = c.post("/login", {"username": "alice", "password": passwords["alice"], "next": "/jobs?vc=vision"})
    assert response.headers["Location"] == "/jobs?vc=vision"


# -- sessions end on logout and on a password change -------------------------------------------------

def _cookie(portal) -> str:
    cookie = portal.client.get_cookie("dlts_session")
    assert cookie is not None
    return cookie.value


def _with_cookie(app, value: str):
    """A fresh browser that only has a copy of somebody's cookie."""
    thief = app.test_client()
    thief.set_cookie("dlts_session", value)
    return thief


def test_a_copied_cookie_stops_working_after_logout(app, as_user):
    alice = as_user("alice")
    copied = _cookie(alice)
    assert _with_cookie(app, copied).get("/jobs").status_code == 200  # the copy works while alice is in
    assert alice.post("/logout").status_code == 302
    response = _with_cookie(app, copied).get("/jobs")
    assert response.status_code == 302 and "/login" in response.headers["Location"]


def test_a_password_change_ends_every_session_of_the_user(app, as_user, sessions):
    from dlts.services import portal_auth

    laptop, phone, bob = as_user("alice"), as_user("alice"), as_user("bob")
    copied = _cookie(laptop)
    with sessions() as s:
        portal_auth.set_password(s, "alice", "a-brand-new-password-1")
    for client in (laptop.client, phone.client, _with_cookie(app, copied)):
        assert client.get("/jobs").status_code == 302
    assert bob.get("/jobs").status_code == 200  # other users stay in
    assert laptop.login("alice", "a-brand-new-password-1").status_code == 302
    assert laptop.get("/jobs").status_code == 200


def test_the_cli_password_change_ends_sessions_too(app, as_user, settings, monkeypatch):
    from click.testing import CliRunner

    from dlts.cli import main

    alice = as_user("alice")
    monkeypatch.setenv("DLTS_HOME", str(settings.home))
    monkeypatch.setenv("DLTS_DATABASE_URL", settings.database_url)
    result = CliRunner().invoke(main, ["user", "password", "alice", "--random"])
    assert result.exit_code == 0, result.output
    assert alice.get("/jobs").status_code == 302


def test_a_cookie_from_before_server_side_sessions_is_no_login(app, as_user):
    """The old cookie carried only the signed user id: a forged-by-replay ``uid`` logs nobody in."""
    old = app.session_interface.get_signing_serializer(app).dumps({"uid": 1, "_permanent": True})
    response = _with_cookie(app, old).get("/jobs")
    assert response.status_code == 302 and "/login" in response.headers["Location"]


def test_the_cookie_holds_no_secret_only_the_session_id(app, as_user, sessions):
    """Decoded with the server's own key (itsdangerous): no Jupyter password, no user id, nothing but
    the session id, the CSRF token and the flag that the session is permanent."""
    alice = as_user("alice")
    page = alice.post("/submit", {"vc": "vision", "image": "debian:12", "command": "sleep 1", "gpus": "0",
                                  "type": "batch", "name": "nb"})
    job_id = int(page.headers["Location"].rstrip("/").rsplit("/", 1)[1])
    alice.get(f"/jobs/{job_id}")
    response = alice.post(f"/jobs/{job_id}/endpoints", {"kind": "jupyter"})
    assert response.status_code == 200
    otp = re.search(r'id="endpoint-token" readonly value="([^"]+)"', response.get_data(as_text=True)).group(1)
    for raw in [c.split(";", 1)[0].split("=", 1)[1] for c in response.headers.getlist("Set-Cookie")] + [_cookie(alice)]:
        decoded = app.session_interface.get_signing_serializer(app).loads(raw)
        assert otp not in json.dumps(decoded) and otp not in raw
        assert set(decoded) <= {"sid", "csrf_token", "_permanent", "_flashes"}, decoded
        with sessions() as s:  # the id itself is stored only as its hash
            assert s.scalar(sa.select(sa.func.count()).select_from(PortalSession)
                            .where(PortalSession.token_hash == decoded["sid"])) == 0


def _set_cookie_header(response) -> str:
    return next(c for c in response.headers.getlist("Set-Cookie") if c.startswith("dlts_session="))


def test_the_cookie_is_httponly_samesite_lax_and_secure_over_https(app, portal_world, passwords):
    for base, secure in (("https://portal.example", True), ("http://localhost", False)):
        c = app.test_client()
        c.get("/login", base_url=base)
        token = re.search(r'name="csrf_token" value="([^"]+)"', c.get("/login", base_url=base).get_data(as_text=True))
        response = c.post("/login", base_url=base, data={"username": "alice", "password": passwords["alice"],
                                                         "csrf_token": token.group(1)})
        assert response.status_code == 302, response.get_data(as_text=True)[:300]
        cookie = _set_cookie_header(response)
        assert "HttpOnly" in cookie and "SameSite=Lax" in cookie
        assert ("; Secure" in cookie) is secure, cookie


@pytest.mark.parametrize("value, expected", [("auto", "auto"), ("true", True), ("false", False)])
def test_session_cookie_secure_is_a_setting(tmp_path, value, expected):
    from dlts.config import load_settings

    assert load_settings(environ={"DLTS_SESSION_COOKIE_SECURE": value, "DLTS_HOME": str(tmp_path)}).session_cookie_secure == expected


def test_secure_true_marks_the_cookie_secure_even_over_plain_http(settings, portal_world, passwords):
    from dlts.app import create_app

    forced = create_app(settings.model_copy(update={"session_cookie_secure": True}))
    c = forced.test_client()
    token = re.search(r'name="csrf_token" value="([^"]+)"', c.get("/login").get_data(as_text=True)).group(1)
    response = c.post("/login", data={"username": "alice", "password": passwords["alice"], "csrf_token": token})
    assert "; Secure" in _set_cookie_header(response)


# -- the login rate limit, under parallel requests to a served app ---------------------------------------

def _parallel_logins(url: str, attempts: list[tuple[str, str]]) -> list[requests.Response]:
    """Each attempt in its own thread and HTTP session (cookie + CSRF first), all posted at once."""
    barrier = threading.Barrier(len(attempts))

    def one(user_password):
        user, password = user_password
        browser = requests.Session()
        page = browser.get(f"{url}/login", timeout=20)
        token = re.search(r'name="csrf_token" value="([^"]+)"', page.text).group(1)
        barrier.wait(timeout=30)
        return browser.post(f"{url}/login", data={"username": user, "password": password, "csrf_token": token},
                            headers={"Accept": "application/json"}, allow_redirects=False, timeout=30)

    with ThreadPoolExecutor(len(attempts)) as pool:
        return list(pool.map(one, attempts))


def test_twelve_parallel_wrong_passwords_get_five_401_and_seven_429(live, portal_world):
    responses = _parallel_logins(live.url, [("bob", f"wrong-guess-{i:04d}") for i in range(12)])
    statuses = sorted(r.status_code for r in responses)
    assert statuses == [401] * 5 + [429] * 7, statuses
    for r in responses:
        if r.status_code == 429:
            retry = int(r.headers["Retry-After"])
            assert 1 <= retry <= 300
            error = r.json()["error"]
            assert error["code"] == "too_many_login_attempts" and f"wait {retry} s" in error["message"]
            assert error["details"]["retry_after_s"] == retry
        else:
            assert r.json()["error"]["code"] == "login_failed"


def test_parallel_guesses_from_one_address_stop_at_its_limit(live, portal_world, passwords):
    # 36 different user names (so no per-user limit bites) from one address: 30 get an answer
    responses = _parallel_logins(live.url, [(f"nobody{i}", "wrong-guess-0000") for i in range(36)])
    statuses = sorted(r.status_code for r in responses)
    assert statuses == [401] * 30 + [429] * 6, statuses
    assert _parallel_logins(live.url, [("alice", passwords["alice"])])[0].status_code == 429


# -- abuse limits on the VC settings page ----------------------------------------------------------------

def test_vc_admin_sets_the_abuse_limits_on_the_settings_page_and_the_submit_form_says_why(as_user, sessions):
    from dlts.models import VirtualCluster

    vcadmin = as_user("vcadmin")
    page = vcadmin.get("/vcs/vision/settings").get_data(as_text=True)
    assert "empty: the cluster&#39;s default (1000)" in page and "empty: the cluster&#39;s default (300)" in page
    form = {"policy": "RF", "max_job_time_h": "", "max_interactive_gpus": "", "user_gpu_quota": "", "notice": ""}
    assert vcadmin.post("/vcs/vision/settings", form | {"max_queued_jobs_per_user": "1",
                                                        "max_submissions_per_minute": "0"}).status_code == 302
    with sessions() as s:
        vc = s.scalar(sa.select(VirtualCluster).where(VirtualCluster.name == "vision"))
        assert (vc.max_queued_jobs_per_user, vc.max_submissions_per_minute) == (1, 0)
    alice = as_user("alice")
    shown = alice.get("/vcs/vision").get_data(as_text=True)
    assert 'id="vc-max-queued">1<' in shown and 'id="vc-max-rate">no limit<' in shown
    job = {"vc": "vision", "image": "debian:12", "command": "sleep 1", "gpus": "0", "type": "batch", "name": "a"}
    assert alice.post("/submit", job).status_code == 302
    refused = alice.post("/submit", job)
    assert refused.status_code == 422 and "at most 1 may wait per user" in refused.get_data(as_text=True)
    bad = vcadmin.post("/vcs/vision/settings", form | {"max_queued_jobs_per_user": "lots"})
    assert bad.status_code == 400 and 'id="err-max_queued_jobs_per_user"' in bad.get_data(as_text=True)
