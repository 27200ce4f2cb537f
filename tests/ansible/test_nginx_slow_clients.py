"""Slow clients, and one client's failed logins, through the nginx the dlts_control role configures,
in front of a real `dlts api`.

The site is rendered from the role's template (as test_templates.py does, with the lab inventory and
short timeouts) and nginx (/usr/sbin/nginx) runs it on loopback with a prefix of its own. Attackers
come from 127.0.0.2, the normal client from 127.0.0.1 (nginx's per-address limit is per source).
Against `dlts api` directly: tests/core/test_api_slow_clients.py."""

from __future__ import annotations

import http.client
import os
import re
import signal
import socket
import ssl
import subprocess
import time
import urllib.parse

import pytest
import requests
import urllib3
import yaml
from ansible_helpers import render_templates, tool

from tests.slow_clients import NORMAL_MAX_S, SlowLoris, answers_while, free_port, start_api, stop_api

pytestmark = pytest.mark.slow

CLIENT_TIMEOUT_S = 3  # dlts_control_nginx_client_timeout_s, short for the test (default 10)
PER_ADDRESS = 4  # dlts_control_nginx_connections_per_address (default 100)
ATTACKER = "127.0.0.2"


@pytest.fixture(scope="module")
def proxied(tmp_path_factory):
    """(https port, nginx prefix): nginx from the role's template in front of `dlts api`."""
    urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)  # the test's self-signed certificate
    work = tmp_path_factory.mktemp("nginx-slow")
    api_port, https_port, http_port = free_port(), free_port(), free_port()
    subprocess.run([tool("openssl"), "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
                    "/CN=localhost", "-keyout", str(work / "tls.key"), "-out", str(work / "tls.crt")],
                   check=True, capture_output=True)
    out = render_templates("vagrant", work / "out", {
        "dlts_listen_port": api_port, "dlts_https_port": https_port, "dlts_control_http_port": http_port,
        "dlts_control_tls_cert": str(work / "tls.crt"), "dlts_control_tls_key": str(work / "tls.key"),
        "dlts_control_venv": str(work / "venv"),
        "dlts_control_nginx_client_timeout_s": CLIENT_TIMEOUT_S,
        "dlts_control_nginx_connections_per_address": PER_ADDRESS,
    }, roles_only=("dlts_control",))
    prefix = work / "nginx"
    prefix.mkdir()
    (prefix / "nginx.conf").write_text(
        ("user root;\n" if os.geteuid() == 0 else "")
        + f"pid {prefix}/nginx.pid;\nerror_log {prefix}/error.log;\nevents {{}}\n"
        f"http {{\n  access_log off;\n  client_body_temp_path {prefix}/body;\n  proxy_temp_path {prefix}/proxy;\n"
        f"  include {out['dlts_control'] / 'nginx-dlts.conf'};\n}}\n")
    # the API's trusted_proxies as the role's dlts.yaml sets it: the client's address is the one nginx forwards
    rendered = yaml.safe_load((out["dlts_control"] / "dlts.yaml").read_text())
    api = start_api(work, api_port, workers=2, settings={"DLTS_TRUSTED_PROXIES": str(rendered["trusted_proxies"])})
    nginx = subprocess.Popen([tool("nginx"), "-p", str(prefix), "-c", str(prefix / "nginx.conf"), "-g", "daemon off;"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if requests.get(f"https://127.0.0.1:{https_port}/readyz", verify=False, timeout=5).status_code == 200:
                    break
            except requests.RequestException:
                pass
            assert nginx.poll() is None, nginx.stderr.read()
            assert time.monotonic() < deadline, "nginx did not come up"
            time.sleep(0.2)
        yield https_port, prefix
    finally:
        nginx.send_signal(signal.SIGQUIT)
        try:
            nginx.wait(timeout=20)
        except subprocess.TimeoutExpired:
            nginx.kill()
        stop_api(api)


def tls_connect(port: int):
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE

    def connect() -> ssl.SSLSocket:
        raw = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(ATTACKER, 0))
        return context.wrap_socket(raw, server_hostname="localhost")
    return connect


def normal_get(port: int):
    return lambda timeout: requests.get(f"https://127.0.0.1:{port}/readyz", verify=False, timeout=timeout)


def test_slow_headers_through_nginx_stall_nobody_and_are_dropped_after_the_header_timeout(proxied):
    port, _ = proxied
    with SlowLoris(tls_connect(port), 12) as slow:
        took = answers_while(slow, normal_get(port), CLIENT_TIMEOUT_S + 4)
    assert took and max(took) < NORMAL_MAX_S, took
    # each slow client was hung up on once its header took longer than client_header_timeout
    # (nginx's default of 60 s kept all of them for a minute)
    assert len(slow.closed_by_server) == 12, slow.closed_by_server
    assert max(slow.closed_by_server) < CLIENT_TIMEOUT_S + 6, slow.closed_by_server


def test_one_address_gets_only_so_many_requests_in_flight(proxied):
    """Clients whose headers are complete and whose bodies trickle count against the limit of
    their address; beyond it nginx answers 429 at once; other addresses are served as before."""
    port, _ = proxied
    connect = tls_connect(port)
    held = []
    try:
        answers = []
        for _ in range(PER_ADDRESS + 3):
            sock = connect()
            sock.sendall(b"POST /api/v1/jobs HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 100000\r\n\r\n{")
            held.append(sock)
            time.sleep(0.05)
        time.sleep(0.5)  # well within client_body_timeout: the held ones are still sending their bodies
        for sock in held:
            sock.setblocking(False)
            try:
                answers.append(sock.recv(64).split(b"\r\n", 1)[0])
            except (ssl.SSLWantReadError, BlockingIOError):
                answers.append(b"(still sending its body)")
        assert answers.count(b"HTTP/1.1 429 Too Many Requests") == 3, answers
        assert answers.count(b"(still sending its body)") == PER_ADDRESS, answers
        took = answers_while(None, normal_get(port), 2)
        assert max(took) < NORMAL_MAX_S, took
    finally:
        for sock in held:
            sock.close()


def portal_login(port: int, source: str, user: str, password: str) -> int:
    """The portal's sign-in form from ``source`` through nginx: its page (a session cookie and the
    form's CSRF token), then the post. The status of the post."""
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=20, source_address=(source, 0), context=context)
    try:
        conn.request("GET", "/login")
        page = conn.getresponse()
        html = page.read().decode()
        cookie = page.getheader("Set-Cookie", "").split(";", 1)[0]
        token = re.search(r'name="csrf_token" value="([^"]+)"', html).group(1)
        form = urllib.parse.urlencode({"csrf_token": token, "username": user, "password": password})
        conn.request("POST", "/login", body=form, headers={"Cookie": cookie,
                                                           "Content-Type": "application/x-www-form-urlencoded"})
        answer = conn.getresponse()
        answer.read()
        return answer.status
    finally:
        conn.close()


def test_one_clients_failed_logins_lock_out_only_that_client(proxied):
    """The role's dlts.yaml trusts its own nginx (trusted_proxies: 1), so the API counts failed
    logins per client address (30 per 5 minutes), not per nginx: the attacker at 127.0.0.2 is
    refused, everyone else still gets to try. (With trusted_proxies 0 every client is 127.0.0.1
    and the thirty-first failure, anyone's, locks the portal for all.)"""
    port, _ = proxied
    for i in range(30):  # thirty users, so the per-user limit (5) is not what stops it
        assert portal_login(port, ATTACKER, f"guess{i}", "not-the-password") == 401
    assert portal_login(port, ATTACKER, "guess-more", "not-the-password") == 429
    assert portal_login(port, "127.0.0.1", "someone", "a-wrong-password") == 401  # not locked out
