"""The endpoint firewall (dlts_agent/firewall.py).

With root: the real nft inside a network namespace this test creates. The "node" namespace runs TCP
servers on two ports inside the guarded range and one outside it; a "client" namespace is joined to
it by two veth pairs, so connections come from two source addresses (IPv4 and IPv6). Probes run
in the client namespace (a dropped SYN is a timeout).

Without root: the parsing of the API's structure, the script, the agent's and the reporter's wiring,
with nft replaced by a recording executable or runner.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from agent_testkit import FakeNode, agent_config

from dlts_agent import firewall as firewall_module
from dlts_agent.agent import Agent
from dlts_agent.config import ConfigError, FirewallConfig, ReportConfig, config_from_mapping
from dlts_agent.firewall import Firewall, FirewallSpecError, find_nft, parse_spec, render
from dlts_agent.reporter import Reporter
from dlts_testing.fake_nvml import healthy_8xa100

IN_A, IN_B, OUTSIDE = 31001, 31002, 8080  # two guarded ports and one outside the range
RANGE = [30000, 32767]
# client-side addresses of the two links; the node's side is .1 / ::1
SRC_A, SRC_B = "10.231.1.2", "10.231.2.2"
DST_A, DST_B = "10.231.1.1", "10.231.2.1"
SRC_A6, SRC_B6 = "fd00:231:1::2", "fd00:231:2::2"
DST_A6, DST_B6 = "fd00:231:1::1", "fd00:231:2::1"


def spec(version: str, *rules: tuple[int, list[str]], port_range=RANGE) -> dict[str, Any]:
    return {"version": version, "port_range": list(port_range), "rules": [{"port": p, "cidrs": c} for p, c in rules]}


# -- the real nft in a network namespace ---------------------------------------------------------

def _why_no_netns() -> str | None:
    if os.geteuid() != 0:
        return "needs root (ip netns, nft); CI runs these as root"
    nft = shutil.which("nft") or ("/usr/sbin/nft" if os.path.exists("/usr/sbin/nft") else None)
    if nft is None:
        return "nft is not installed (apt-get install nftables; .ci/dev installs it)"
    if shutil.which("ip") is None:
        return "ip (iproute2) is not installed"
    probe = f"dltsfwprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    try:
        listed = subprocess.run(["ip", "netns", "exec", probe, nft, "list", "ruleset"], capture_output=True, text=True)
        if listed.returncode != 0:
            return f"nft does not work in a network namespace here: {listed.stderr.strip()}"
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


needs_netns = pytest.mark.skipif(bool(_why_no_netns()), reason=_why_no_netns() or "")

SERVER = textwrap.dedent("""
    import socket, sys, threading
    def serve(port):
        s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        s.bind(("::", port)); s.listen(512)
        while True:
            c, _ = s.accept()
            try: c.sendall(b"ok\\n")
            except OSError: pass
            c.close()
    for p in sys.argv[1:]:
        threading.Thread(target=serve, args=(int(p),), daemon=True).start()
    print("listening", flush=True)
    threading.Event().wait()
""")

# reads probes [[src, dst, port], ...] as JSON, prints {"src dst port": "open" | "dropped" | error}
PROBE = textwrap.dedent("""
    import json, socket, sys, threading
    probes, timeout = json.loads(sys.argv[1]), float(sys.argv[2])
    out = {}
    def probe(src, dst, port):
        family = socket.AF_INET6 if ":" in dst else socket.AF_INET
        s = socket.socket(family, socket.SOCK_STREAM); s.settimeout(timeout)
        try:
            s.bind((src, 0)); s.connect((dst, port))
            out[f"{src} {dst} {port}"] = "open" if s.recv(3) == b"ok\\n" else "no banner"
        except socket.timeout: out[f"{src} {dst} {port}"] = "dropped"
        except OSError as e: out[f"{src} {dst} {port}"] = type(e).__name__
        finally: s.close()
    threads = [threading.Thread(target=probe, args=p) for p in probes]
    [t.start() for t in threads]; [t.join() for t in threads]
    print(json.dumps(out))
""")

# for duration_s, a new SYN from src every millisecond to dst:port; prints how many got through
HAMMER = textwrap.dedent("""
    import errno, select, socket, sys, time
    src, dst, port, duration = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    pending, connected, sent = {}, 0, 0
    poller = select.poll()
    end = time.monotonic() + duration
    while time.monotonic() < end:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM); s.setblocking(False); s.bind((src, 0))
        if s.connect_ex((dst, port)) in (0, errno.EINPROGRESS):
            pending[s.fileno()] = (s, time.monotonic()); poller.register(s, select.POLLOUT); sent += 1
        else:
            s.close()
        for fd, _ in poller.poll(1):
            sock, _ = pending.pop(fd); poller.unregister(fd)
            if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
                connected += 1
            sock.close()
        now = time.monotonic()
        for fd, (sock, t) in list(pending.items()):
            if now - t > 0.5:
                poller.unregister(fd); pending.pop(fd); sock.close()
    print(sent, connected)
""")


class Lab:
    """Two namespaces: ``node`` (servers + the firewall) and ``client`` (two links to it)."""

    def __init__(self, tmp_path: Path) -> None:
        tag = f"{os.getpid()}{threading.get_ident() % 1000}"
        self.node, self.client = f"dltsfw-node-{tag}", f"dltsfw-cli-{tag}"
        self.tmp = tmp_path
        self.server: subprocess.Popen | None = None
        self.ipv6 = True

    def ip(self, *args: str, ns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
        cmd = ["ip", *(("-n", ns) if ns else ()), *args]
        return subprocess.run(cmd, capture_output=True, text=True, check=check, timeout=30)

    def exec(self, ns: str, *cmd: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(["ip", "netns", "exec", ns, *cmd], capture_output=True, text=True, timeout=timeout)

    def up(self) -> None:
        for ns in (self.node, self.client):
            self.ip("netns", "add", ns)
            self.ip("link", "set", "lo", "up", ns=ns)
            for conf in ("all", "default"):  # no duplicate address detection: addresses usable at once
                self.exec(ns, "sysctl", "-qw", f"net.ipv6.conf.{conf}.accept_dad=0")
        for link, (src, dst, src6, dst6) in {"a": (SRC_A, DST_A, SRC_A6, DST_A6), "b": (SRC_B, DST_B, SRC_B6, DST_B6)}.items():
            self.ip("link", "add", f"c{link}", "type", "veth", "peer", "name", f"n{link}", "netns", self.node, ns=self.client)
            self.ip("addr", "add", f"{src}/24", "dev", f"c{link}", ns=self.client)
            self.ip("addr", "add", f"{dst}/24", "dev", f"n{link}", ns=self.node)
            v6 = [self.ip("addr", "add", f"{src6}/64", "dev", f"c{link}", "nodad", ns=self.client, check=False),
                  self.ip("addr", "add", f"{dst6}/64", "dev", f"n{link}", "nodad", ns=self.node, check=False)]
            self.ipv6 = self.ipv6 and all(r.returncode == 0 for r in v6)
            self.ip("link", "set", f"c{link}", "up", ns=self.client)
            self.ip("link", "set", f"n{link}", "up", ns=self.node)
        self.server = subprocess.Popen(["ip", "netns", "exec", self.node, sys.executable, "-c", SERVER,
                                        str(IN_A), str(IN_B), str(OUTSIDE)], stdout=subprocess.PIPE, text=True)
        assert self.server.stdout.readline().strip() == "listening"
        # the first packets on a new link wait for neighbour discovery: wait until every path answers
        paths = [(SRC_A, DST_A, IN_A), (SRC_B, DST_B, IN_A)] + ([(SRC_A6, DST_A6, IN_A), (SRC_B6, DST_B6, IN_A)] if self.ipv6 else [])
        deadline = time.monotonic() + 15
        while set(self.probe(*paths, timeout_s=2).values()) != {"open"}:
            assert time.monotonic() < deadline, "the test network did not come up"

    def down(self) -> None:
        if self.server is not None:
            self.server.kill()
            self.server.wait(10)
        for ns in (self.client, self.node):  # deleting a namespace removes its links and rules
            self.ip("netns", "del", ns, check=False)

    def firewall(self, state_dir: Path | None = None, **kwargs: Any) -> Firewall:
        nft = shutil.which("nft") or "/usr/sbin/nft"
        return Firewall(FirewallConfig(enabled=True), str(state_dir or self.tmp / "state"),
                        nft=["ip", "netns", "exec", self.node, nft], **kwargs)

    def probe(self, *probes: tuple[str, str, int], timeout_s: float = 1.0, ns: str | None = None) -> dict[tuple[str, int], str]:
        done = self.exec(ns or self.client, sys.executable, "-c", PROBE, json.dumps(probes), str(timeout_s))
        assert done.returncode == 0, done.stderr
        result = json.loads(done.stdout)
        return {(src, port): result[f"{src} {dst} {port}"] for src, dst, port in probes}

    def nft(self, *args: str) -> str:
        done = self.exec(self.node, "nft", *args)
        assert done.returncode == 0, done.stderr
        return done.stdout


@pytest.fixture
def lab(tmp_path):
    reason = _why_no_netns()
    if reason:
        pytest.skip(reason)
    lab = Lab(tmp_path)
    try:
        lab.up()
        yield lab
    finally:
        lab.down()


EVERY_V4 = ((SRC_A, DST_A, IN_A), (SRC_B, DST_B, IN_A), (SRC_A, DST_A, IN_B), (SRC_B, DST_B, IN_B),
            (SRC_A, DST_A, OUTSIDE), (SRC_B, DST_B, OUTSIDE))


@needs_netns
def test_only_the_allowed_source_reaches_a_guarded_port_and_other_ports_are_untouched(lab):
    # before: everything is open (so the drops below are the firewall's doing)
    assert set(lab.probe(*EVERY_V4).values()) == {"open"}
    fw = lab.firewall()
    assert fw.update(spec("v1", (IN_A, [SRC_A])))
    assert lab.probe(*EVERY_V4) == {
        (SRC_A, IN_A): "open",  # listed pair
        (SRC_B, IN_A): "dropped",  # another source
        (SRC_A, IN_B): "dropped",  # a guarded port without a rule
        (SRC_B, IN_B): "dropped",
        (SRC_A, OUTSIDE): "open",  # outside the range nothing is touched
        (SRC_B, OUTSIDE): "open",
    }
    # the node itself (loopback) is not a remote source
    assert lab.probe((DST_B, DST_B, IN_A), ns=lab.node) == {(DST_B, IN_A): "open"}
    status = fw.status()
    assert (status.applied_version, status.pairs, status.last_apply_ok, status.applies_total) == ("v1", 1, True, 1)
    assert "counter packets" in lab.nft("list", "table", "inet", "dlts_endpoints")


@needs_netns
def test_a_new_version_replaces_the_rules_in_one_transaction(lab):
    fw = lab.firewall()
    a_on_in_a = spec("v-a", (IN_A, [f"{SRC_A}/32"]))
    a_on_in_b = spec("v-b", (IN_B, ["10.231.1.0/24"]))  # a network, not only a host
    assert fw.update(a_on_in_a)
    assert not fw.update(a_on_in_a)  # same version: nft is not run again
    assert fw.status().applies_total == 1
    assert fw.update(a_on_in_b)
    got = lab.probe(*EVERY_V4)
    assert (got[(SRC_A, IN_A)], got[(SRC_A, IN_B)], got[(SRC_B, IN_B)]) == ("dropped", "open", "dropped")
    assert lab.nft("list", "tables").split().count("dlts_endpoints") == 1  # replaced, not added beside
    # SRC_B is never allowed: while versions alternate, a SYN every millisecond from it must never get
    # through (a delete-then-add in two steps would leave the port open in between)
    hammer = subprocess.Popen(["ip", "netns", "exec", lab.client, sys.executable, "-c", HAMMER, SRC_B, DST_B,
                               str(IN_A), "3"], stdout=subprocess.PIPE, text=True)
    time.sleep(0.3)
    for n in range(20):
        assert fw.update(spec(f"v{n}", (IN_A if n % 2 else IN_B, [SRC_A])))
    sent, connected = map(int, hammer.communicate(timeout=30)[0].split())
    assert sent > 500 and connected == 0, (sent, connected)


@needs_netns
def test_a_ruleset_nft_refuses_keeps_the_old_rules(lab, monkeypatch, caplog):
    state = lab.tmp / "state"
    fw = lab.firewall(state)
    assert fw.update(spec("good", (IN_A, [SRC_A])))
    good_script = (state / "firewall.nft").read_text()
    # nft refuses the whole transaction, including the table's delete at its top
    monkeypatch.setattr(firewall_module, "render", lambda s: render(s).replace("counter drop", "counter drop\n\t\tbogus statement"))
    with caplog.at_level(logging.ERROR, logger="dlts_agent.firewall"):
        assert not fw.update(spec("broken", (IN_A, [SRC_B])))
        assert not fw.update(spec("broken", (IN_A, [SRC_B])))  # retried with the next report, logged once
    assert len([r for r in caplog.records if "not changed" in r.getMessage()]) == 1
    assert "rules of version good stay" in caplog.text and "nft -f exited with 1" in caplog.text
    got = lab.probe((SRC_A, DST_A, IN_A), (SRC_B, DST_B, IN_A))
    assert got == {(SRC_A, IN_A): "open", (SRC_B, IN_A): "dropped"}
    status = fw.status()
    assert (status.applied_version, status.last_apply_ok, status.failures_total) == ("good", False, 2)
    assert (state / "firewall.nft").read_text() == good_script  # the saved script is the one in force
    assert "bogus statement" in (state / "firewall.nft.failed").read_text()
    monkeypatch.undo()
    assert fw.update(spec("fixed", (IN_A, [SRC_B])))
    assert fw.status().last_apply_ok is True


@needs_netns
def test_ipv6_sources_are_guarded_too(lab):
    if not lab.ipv6:
        pytest.skip("IPv6 addresses cannot be added in this network namespace")
    fw = lab.firewall()
    probes = ((SRC_A6, DST_A6, IN_A), (SRC_B6, DST_B6, IN_A), (SRC_B6, DST_B6, OUTSIDE), (SRC_A, DST_A, IN_A))
    assert set(lab.probe(*probes).values()) == {"open"}
    assert fw.update(spec("v6", (IN_A, [SRC_A6])))
    assert lab.probe(*probes) == {(SRC_A6, IN_A): "open", (SRC_B6, IN_A): "dropped", (SRC_B6, OUTSIDE): "open",
                                  (SRC_A, IN_A): "dropped"}
    assert fw.update(spec("v6b", (IN_A, ["fd00:231:2::/64", SRC_A])))
    assert lab.probe(*probes) == {(SRC_A6, IN_A): "dropped", (SRC_B6, IN_A): "open", (SRC_B6, OUTSIDE): "open",
                                  (SRC_A, IN_A): "open"}


@needs_netns
def test_after_a_reboot_the_saved_rules_come_back_before_the_first_report(lab):
    state = lab.tmp / "state"
    assert lab.firewall(state).update(spec("before-reboot", (IN_A, [SRC_A])))
    lab.nft("delete", "table", "inet", "dlts_endpoints")  # what a reboot does
    assert lab.probe((SRC_B, DST_B, IN_A)) == {(SRC_B, IN_A): "open"}
    fresh = lab.firewall(state)
    assert fresh.restore()
    assert lab.probe((SRC_A, DST_A, IN_A), (SRC_B, DST_B, IN_A)) == {(SRC_A, IN_A): "open", (SRC_B, IN_A): "dropped"}
    assert fresh.applied_version == "before-reboot" and fresh.status().pairs == 1
    assert not fresh.update(spec("before-reboot", (IN_A, [SRC_A])))  # the API's same version: nothing to do


@needs_netns
@pytest.mark.parametrize("tamper", [("flush", "table", "inet", "dlts_endpoints"),
                                    ("delete", "table", "inet", "dlts_endpoints"),
                                    ("flush", "chain", "inet", "dlts_endpoints", "guarded"),
                                    ("delete", "element", "inet", "dlts_endpoints", "allow4", f"{{ {SRC_A} . {IN_B} }}")])
def test_a_table_changed_by_hand_is_put_back_by_the_next_check(lab, tamper, caplog):
    fw = lab.firewall()
    assert fw.update(spec("v1", (IN_A, [SRC_A]), (IN_B, [SRC_A])))
    assert not fw.check()  # untouched: nothing to do, nft -f is not run
    assert fw.status().applies_total == 1
    in_force = {(SRC_A, IN_A): "open", (SRC_B, IN_A): "dropped", (SRC_A, IN_B): "open"}
    paths = ((SRC_A, DST_A, IN_A), (SRC_B, DST_B, IN_A), (SRC_A, DST_A, IN_B))
    assert lab.probe(*paths) == in_force
    lab.nft(*tamper)
    assert lab.probe(*paths) != in_force  # the rules the API asked for are not in force (same version)
    with caplog.at_level(logging.WARNING, logger="dlts_agent.firewall"):
        assert fw.check()
    assert "restoring version v1" in caplog.text
    assert lab.probe(*paths) == in_force
    status = fw.status()
    assert (status.applied_version, status.restores_total, status.last_apply_ok) == ("v1", 1, True)
    assert not fw.check()  # and it is quiet again
    assert lab.nft("list", "tables").split().count("dlts_endpoints") == 1


@needs_netns
def test_the_running_agent_restores_a_flushed_table_within_an_interval(lab, node: FakeNode, tmp_path, api):
    wrapper = tmp_path / "nft-in-node"
    wrapper.write_text(f"#!/bin/sh\nexec ip netns exec {lab.node} {shutil.which('nft') or '/usr/sbin/nft'} \"$@\"\n")
    wrapper.chmod(0o755)
    (node.root / "tok").write_text("t0ken\n")
    api.body = {"orders": [], "firewall": spec("v1", (IN_A, [SRC_A]))}
    cfg = agent_config(node, interval_s=0.2, firewall={"enabled": True, "nft": str(wrapper)},
                       report={"enabled": True, "api_url": api.url, "node_token_file": str(node.root / "tok"),
                               "interval_s": 0.2, "timeout_s": 2})
    agent = Agent(cfg, nvml_lib=healthy_8xa100())
    stop = threading.Event()
    thread = threading.Thread(target=agent.run, args=(stop,), daemon=True)
    thread.start()
    closed = {(SRC_A, IN_A): "open", (SRC_B, IN_A): "dropped"}
    try:
        assert _wait_for(lambda: agent.registry.get_sample_value("dlts_node_firewall_rules") == 1)
        assert lab.probe((SRC_A, DST_A, IN_A), (SRC_B, DST_B, IN_A)) == closed
        for tamper in (("flush", "table"), ("delete", "table")):
            lab.nft(*tamper, "inet", "dlts_endpoints")
            assert _wait_for(lambda: lab.probe((SRC_A, DST_A, IN_A), (SRC_B, DST_B, IN_A), timeout_s=0.5) == closed,
                             timeout_s=15)
        assert _wait_for(lambda: agent.registry.get_sample_value("dlts_node_firewall_restores_total") == 2)
        assert agent.registry.get_sample_value("dlts_node_firewall_applies_total") == 3  # v1, then two restores
    finally:
        stop.set()
        thread.join(10)


@needs_netns
def test_overlapping_networks_from_the_api_are_merged_not_refused(lab):
    # nft refuses overlapping elements in an interval set ("File exists"); the agent collapses them
    fw = lab.firewall()
    assert fw.update(spec("overlap", (IN_A, ["10.231.0.0/16", "10.231.1.0/24", SRC_A]), (IN_B, [SRC_B, SRC_B])))
    assert lab.probe((SRC_A, DST_A, IN_A), (SRC_B, DST_B, IN_A), (SRC_A, DST_A, IN_B), (SRC_B, DST_B, IN_B)) == {
        (SRC_A, IN_A): "open", (SRC_B, IN_A): "open", (SRC_A, IN_B): "dropped", (SRC_B, IN_B): "open"}
    assert fw.status().pairs == 2


# -- without root: the API's structure, the script, the wiring ------------------------------------

@pytest.mark.parametrize("bad,says", [
    ("rules", "expected an object"),
    ({"port_range": RANGE, "rules": []}, "firewall.version"),
    (spec("v\nflush ruleset"), "firewall.version"),  # would end the script's comment line
    (spec("v", port_range=[30000]), "firewall.port_range"),
    (spec("v", port_range=[32767, 30000]), "above hi"),
    (spec("v", port_range=[0, 30000]), "port_range\\[0\\]"),
    (spec("v", port_range=[True, 30000]), "port_range\\[0\\]"),
    (spec("v", (8080, ["10.0.0.0/8"])), "outside port_range"),
    (spec("v", ("31001", ["10.0.0.0/8"])), "rules\\[0\\].port"),
    (spec("v", (31001, "10.0.0.0/8")), "rules\\[0\\].cidrs"),
    (spec("v", (31001, ["10.0.0.0/8", "example.com"])), "not an IPv4/IPv6 network"),
    (spec("v", (31001, ["10.0.0.0/8 . 22 } ; flush ruleset"])), "not an IPv4/IPv6 network"),
    (spec("v", (31001, [7])), "is not a string"),
    ({**spec("v"), "rules": [None]}, "rules\\[0\\]"),
])
def test_a_malformed_structure_is_refused_whole(bad, says):
    with pytest.raises(FirewallSpecError, match=says):
        parse_spec(bad)


def test_the_script_replaces_one_table_and_guards_only_tcp_to_the_range():
    script = render(parse_spec(spec("abc", (31001, ["2001:db8::/48", "192.0.2.0/25", "192.0.2.128/25"]),
                                    (31002, ["198.51.100.7"]))))
    lines = [line.strip() for line in script.splitlines()]
    assert lines[lines.index("table inet dlts_endpoints") + 1] == "delete table inet dlts_endpoints"
    assert "# version: abc" in lines and "tcp dport 30000-32767 jump guarded" in lines
    assert "type filter hook prerouting priority -150; policy accept;" in lines
    assert [x for x in lines if x.startswith(("192.", "198."))] == ["192.0.2.0/24 . 31001,", "198.51.100.7/32 . 31002"]
    assert "2001:db8::/48 . 31001" in lines
    single = render(parse_spec(spec("one", port_range=[31000, 31000])))
    assert "tcp dport 31000 jump guarded" in single and "elements" not in single


def fake_nft(directory: Path, rc: int = 0) -> Path:
    """An nft executable that copies each script it is given to directory/applied-N.nft."""
    path = directory / "nft"
    path.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        if [ "$1" = "-s" ]; then echo "table inet dlts_endpoints (listed)"; exit {rc}; fi
        n=$(ls "{directory}" | grep -c '^applied-')
        cp "$2" "{directory}/applied-$n.nft"
        [ {rc} = 0 ] || echo "Error: simulated failure" >&2
        exit {rc}
        """))
    path.chmod(0o755)
    return path


def applied(directory: Path) -> list[str]:
    return [p.read_text() for p in sorted(directory.glob("applied-*.nft"), key=lambda p: int(p.stem.split("-")[1]))]


class FirewallAPI:
    """Plays the API's report endpoint: answers every report with ``body``."""

    def __init__(self) -> None:
        self.body: Any = {"orders": []}
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                data = api.body if isinstance(api.body, bytes) else json.dumps(api.body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def api():
    server = FirewallAPI()
    yield server
    server.close()


def test_the_reporter_applies_only_a_new_version_and_survives_malformed_firewalls(tmp_path, api, caplog):
    calls: list[str] = []
    fw = Firewall(FirewallConfig(enabled=True), str(tmp_path), nft=["nft"],
                  runner=lambda argv, timeout_s: (calls.append(Path(argv[-1]).read_text()) if "-f" in argv else None) or (0, ""))
    reporter = Reporter(ReportConfig(enabled=True, api_url=api.url, timeout_s=5), "n1", "tok",
                        lambda: _snapshot(), None, on_firewall=fw.update)
    order = {"id": "1", "action": "drop_caches", "target": "", "dry_run": True}
    api.body = {"orders": [order], "firewall": spec("v1", (31001, ["203.0.113.7"]))}
    assert reporter.report_once() == [order]
    assert reporter.report_once() == [order] and len(calls) == 1  # same version: not applied again
    for malformed in ("garbage", spec("v2", (31001, ["not-an-ip"])), {"version": "v3"}, [1, 2]):
        api.body = {"orders": [order], "firewall": malformed}
        assert reporter.report_once() == [order]  # orders still arrive
    assert len(calls) == 1 and fw.applied_version == "v1"
    assert fw.status().last_apply_ok is False and fw.status().failures_total == 4
    assert "refused the API's firewall" in caplog.text
    api.body = b"not json"
    assert reporter.report_once() == [] and fw.applied_version == "v1"
    api.body = {"orders": []}  # an API without the firewall: the rules stay, a warning says why
    assert reporter.report_once() == [] and fw.applied_version == "v1"
    assert "carries no firewall" in caplog.text
    api.body = {"orders": [], "firewall": spec("v4", (31001, ["203.0.113.7"]), (31002, ["2001:db8::/32"]))}
    reporter.report_once()
    assert len(calls) == 2 and "2001:db8::/32 . 31002" in calls[1] and fw.applied_version == "v4"
    assert fw.status().last_apply_ok is True


def test_a_firewall_that_raises_does_not_stop_the_report(tmp_path, api):
    def explode(_):
        raise RuntimeError("boom")

    reporter = Reporter(ReportConfig(enabled=True, api_url=api.url, timeout_s=5), "n1", "tok", lambda: _snapshot(), None,
                        on_firewall=explode)
    api.body = {"orders": [{"id": "7"}], "firewall": spec("v1")}
    assert reporter.report_once() == [{"id": "7"}]


def _snapshot():
    from dlts_agent.model import AgentSnapshot, Collection

    return AgentSnapshot("n1", "t", Collection(time.time(), {}), (), {}, {})


def test_the_agent_applies_what_the_api_sends_and_exports_it(node: FakeNode, tmp_path, api):
    bin_dir = tmp_path / "nftbin"
    bin_dir.mkdir()
    (node.root / "tok").write_text("t0ken\n")
    api.body = {"orders": [], "firewall": spec("v1", (31001, ["203.0.113.7", "198.51.100.0/24"]))}
    cfg = agent_config(node, interval_s=0.1, firewall={"enabled": True, "nft": str(fake_nft(bin_dir))},
                       report={"enabled": True, "api_url": api.url, "node_token_file": str(node.root / "tok"),
                               "interval_s": 0.1, "timeout_s": 2})
    agent = Agent(cfg, nvml_lib=healthy_8xa100())
    stop = threading.Event()
    thread = threading.Thread(target=agent.run, args=(stop,), daemon=True)
    thread.start()
    try:
        assert _wait_for(lambda: agent.registry.get_sample_value("dlts_node_firewall_rules") == 2)
        assert agent.registry.get_sample_value("dlts_node_firewall_last_apply_success") == 1
        assert agent.registry.get_sample_value("dlts_node_firewall_applies_total") == 1
        assert agent.registry.get_sample_value("dlts_node_firewall_last_success_timestamp_seconds") > 0
        time.sleep(0.4)  # several more reports with the same version
        assert len(applied(bin_dir)) == 1
        api.body = {"orders": [], "firewall": spec("v2")}
        assert _wait_for(lambda: agent.registry.get_sample_value("dlts_node_firewall_rules") == 0)
        assert b"dlts_node_firewall_applies_total 2.0" in agent.render()
    finally:
        stop.set()
        thread.join(10)
    scripts = applied(bin_dir)
    assert len(scripts) == 2 and "203.0.113.7/32 . 31001" in scripts[0] and "elements" not in scripts[1]
    assert Path(cfg.state_dir, "firewall.nft").read_text() == scripts[1]


def test_a_failing_nft_is_exported_and_the_agent_keeps_reporting(node: FakeNode, tmp_path, api):
    bin_dir = tmp_path / "nftbin"
    bin_dir.mkdir()
    (node.root / "tok").write_text("t0ken\n")
    api.body = {"orders": [], "firewall": spec("v1", (31001, ["203.0.113.7"]))}
    cfg = agent_config(node, firewall={"enabled": True, "nft": str(fake_nft(bin_dir, rc=1))},
                       report={"enabled": True, "api_url": api.url, "node_token_file": str(node.root / "tok"),
                               "interval_s": 0.1, "timeout_s": 2})
    agent = Agent(cfg, nvml_lib=healthy_8xa100())
    stop = threading.Event()
    thread = threading.Thread(target=agent.run, args=(stop,), daemon=True)
    thread.start()
    try:
        assert _wait_for(lambda: (agent.registry.get_sample_value("dlts_node_firewall_apply_failures_total") or 0) >= 2)
        assert agent.registry.get_sample_value("dlts_node_firewall_last_apply_success") == 0
        assert agent.registry.get_sample_value("dlts_node_firewall_rules") == 0
        assert agent.latest().report.consecutive_failures == 0
    finally:
        stop.set()
        thread.join(10)
    assert not Path(cfg.state_dir, "firewall.nft").exists()
    assert "simulated failure" not in Path(cfg.state_dir, "firewall.nft.failed").read_text()  # the script, not nft's output


def _wait_for(cond, timeout_s: float = 8.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return False


def test_config_needs_reporting_and_an_nft_binary(tmp_path):
    with pytest.raises(ConfigError, match="firewall.enabled: the rules arrive in the report's response"):
        config_from_mapping({"firewall": {"enabled": True}})
    with pytest.raises(ConfigError, match="firewall.timeout_s"):
        config_from_mapping({"firewall": {"timeout_s": 0}})
    with pytest.raises(ConfigError, match="nft not found .*install the nftables package"):
        find_nft(str(tmp_path / "nft"))
    assert find_nft(str(fake_nft(tmp_path))) == str(tmp_path / "nft")
    assert config_from_mapping({}).firewall == FirewallConfig(enabled=False, nft="", timeout_s=30.0)
