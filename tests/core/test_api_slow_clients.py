"""Slow clients against `dlts api` itself (gunicorn, no proxy in front): clients that send their
request headers one byte a second must not stall the API for everyone else (docs/security-host.md).
The same attack through the nginx the Ansible role configures: tests/ansible/test_nginx_slow_clients.py."""

from __future__ import annotations

import socket

import requests

from tests.slow_clients import NORMAL_MAX_S, SlowLoris, answers_while, free_port, start_api, stop_api

SLOW_CLIENTS = 6


def test_clients_sending_headers_a_byte_a_second_do_not_stall_dlts_api(tmp_path):
    port = free_port()
    api = start_api(tmp_path, port, workers=2)
    try:
        connect = lambda: socket.create_connection(("127.0.0.1", port), timeout=5)
        with SlowLoris(connect, SLOW_CLIENTS) as slow:
            took = answers_while(slow, lambda timeout: requests.get(f"http://127.0.0.1:{port}/readyz", timeout=timeout), 6)
        # 2 workers, 6 slow clients: with sync workers every request timed out here
        assert took and max(took) < NORMAL_MAX_S, took
    finally:
        stop_api(api)
