"""Portal sessions and login hardening: where a login may send the browser next, sessions that end
on logout and on a password change, no secret in the cookie, and the cookie's flags."""

from __future__ import annotations

import pytest

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
GOOD_NEXT = ["/jobs", "/jobs?vc=vision&status=active", "/jobs/3", "/tokens", "/jobs?"]


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
