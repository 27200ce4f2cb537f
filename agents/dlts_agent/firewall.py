"""The endpoint firewall: the API's allowlist enforced on this node with nftables.

Job endpoints are Kubernetes NodePorts, open on every node. The API sends every node the same
desired state in each report response (``firewall``, docs/agent.md "Endpoint firewall"):
``{"version", "port_range": [lo, hi], "rules": [{"port", "cidrs"}]}``. Inside the port range, TCP
gets through only from a listed (source, port) pair; outside it nothing is touched.

This module owns one nftables table, ``inet dlts_endpoints``, replaced whole in one ``nft -f``
transaction: the script creates the table if missing, deletes it, and defines it again, so the
kernel switches from the old rules to the new ones at once or, when nft refuses the script, keeps
the old ones (never an open gap). Its chain hooks prerouting at priority -150, before kube-proxy's
DNAT (-100), so it sees the NodePort the client asked for. Sources are kept in interval sets of
``ipv4_addr . inet_service`` / ``ipv6_addr . inet_service``.

The script last applied is kept in the state directory (``firewall.nft``) and applied again when the
agent starts, so a rebooted node closes the guarded ports before its first report. Every collection
interval ``check`` lists the table (``nft -s list table``: without counters) and compares it with
the listing taken right after the last apply: a table someone flushed or deleted by hand (which opens
every guarded port) is put back at once, not when the allowlist's version next changes. The nft binary
is the one seam: the constructor takes the command line to run it (tests run it in a network
namespace).
"""

from __future__ import annotations

import ipaddress
import logging
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from dlts_agent.config import ConfigError, FirewallConfig
from dlts_agent.model import FirewallStatus

log = logging.getLogger(__name__)

TABLE = "dlts_endpoints"
SCRIPT_NAME = "firewall.nft"
FAILED_NAME = "firewall.nft.failed"
NEW_NAME = "firewall.nft.new"
VERSION_LINE = re.compile(r"^# version: ([A-Za-z0-9._:-]{1,128})$", re.MULTILINE)
PAIRS_LINE = re.compile(r"^# (\d+) \(source, port\) pair", re.MULTILINE)
_VERSION = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
MAX_RULES = 65536
MAX_CIDRS_PER_RULE = 4096


class FirewallSpecError(ValueError):
    """The API's ``firewall`` value is not the documented structure; nothing is applied."""


@dataclass(frozen=True)
class FirewallSpec:
    version: str
    port_range: tuple[int, int]
    # port -> sources, each family collapsed so that no two elements overlap (nft refuses overlaps)
    rules: tuple[tuple[int, tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]], ...]

    @property
    def pairs(self) -> int:
        return sum(len(sources) for _, sources in self.rules)


def _port(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise FirewallSpecError(f"{where}: expected a TCP port 1-65535, got {value!r}")
    return value


def parse_spec(data: Any) -> FirewallSpec:
    """Validate the API's structure into a spec; refuse anything else whole (FirewallSpecError)."""
    if not isinstance(data, dict):
        raise FirewallSpecError(f"firewall: expected an object, got {type(data).__name__}")
    version = data.get("version")
    if not isinstance(version, str) or not _VERSION.match(version):
        raise FirewallSpecError(f"firewall.version: expected up to 128 letters, digits or '._:-', got {version!r}")
    port_range = data.get("port_range")
    if not isinstance(port_range, list) or len(port_range) != 2:
        raise FirewallSpecError(f"firewall.port_range: expected [lo, hi], got {port_range!r}")
    low, high = _port(port_range[0], "firewall.port_range[0]"), _port(port_range[1], "firewall.port_range[1]")
    if low > high:
        raise FirewallSpecError(f"firewall.port_range: lo {low} is above hi {high}")
    rules = data.get("rules")
    if not isinstance(rules, list) or len(rules) > MAX_RULES:
        raise FirewallSpecError(f"firewall.rules: expected a list of at most {MAX_RULES} rules")
    by_port: dict[int, list[ipaddress.IPv4Network | ipaddress.IPv6Network]] = {}
    for i, rule in enumerate(rules):
        if not isinstance(rule, dict):
            raise FirewallSpecError(f"firewall.rules[{i}]: expected an object, got {rule!r}")
        port = _port(rule.get("port"), f"firewall.rules[{i}].port")
        if not low <= port <= high:
            raise FirewallSpecError(f"firewall.rules[{i}].port: {port} is outside port_range {low}-{high}")
        cidrs = rule.get("cidrs")
        if not isinstance(cidrs, list) or len(cidrs) > MAX_CIDRS_PER_RULE:
            raise FirewallSpecError(f"firewall.rules[{i}].cidrs: expected a list of at most {MAX_CIDRS_PER_RULE} networks")
        for cidr in cidrs:
            if not isinstance(cidr, str):
                raise FirewallSpecError(f"firewall.rules[{i}].cidrs: {cidr!r} is not a string")
            try:
                network = ipaddress.ip_network(cidr.strip(), strict=False)
            except ValueError:
                raise FirewallSpecError(f"firewall.rules[{i}].cidrs: {cidr[:64]!r} is not an IPv4/IPv6 network") from None
            by_port.setdefault(port, []).append(network)
    collapsed = []
    for port, networks in sorted(by_port.items()):
        merged: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
        merged.extend(ipaddress.collapse_addresses([n for n in networks if isinstance(n, ipaddress.IPv4Network)]))
        merged.extend(ipaddress.collapse_addresses([n for n in networks if isinstance(n, ipaddress.IPv6Network)]))
        if merged:
            collapsed.append((port, tuple(merged)))
    return FirewallSpec(version, (low, high), tuple(collapsed))


def render(spec: FirewallSpec) -> str:
    """The nft script that replaces the table whole, in one transaction."""
    low, high = spec.port_range
    ports = f"{low}-{high}" if low != high else str(low)

    def elements(family: int) -> str:
        items = [f"{net} . {port}" for port, sources in spec.rules for net in sources if net.version == family]
        if not items:
            return ""
        return "\t\telements = {\n" + ",\n".join(f"\t\t\t{item}" for item in items) + "\n\t\t}\n"

    return (
        "#!/usr/sbin/nft -f\n"
        "# DLTS endpoint firewall, written by dlts-agent (docs/agent.md); replaced whole on every change.\n"
        f"# version: {spec.version}\n"
        f"# {spec.pairs} (source, port) pair(s) may reach TCP ports {ports}; all other TCP to them is dropped.\n"
        f"table inet {TABLE}\n"
        f"delete table inet {TABLE}\n"
        f"table inet {TABLE} {{\n"
        "\tset allow4 {\n\t\ttype ipv4_addr . inet_service\n\t\tflags interval\n" + elements(4) + "\t}\n"
        "\tset allow6 {\n\t\ttype ipv6_addr . inet_service\n\t\tflags interval\n" + elements(6) + "\t}\n"
        "\t# before kube-proxy's DNAT (-100): the destination is still the NodePort\n"
        "\tchain prerouting {\n\t\ttype filter hook prerouting priority -150; policy accept;\n"
        f"\t\ttcp dport {ports} jump guarded\n\t}}\n"
        "\tchain guarded {\n"
        "\t\tiif \"lo\" accept\n"
        "\t\t# replies to connections this node opened from a port in the range\n"
        "\t\tct direction reply accept\n"
        "\t\tip saddr . tcp dport @allow4 accept\n"
        "\t\tip6 saddr . tcp dport @allow6 accept\n"
        "\t\tcounter drop\n"
        "\t}\n"
        "}\n"
    )


def find_nft(configured: str) -> str:
    """``firewall.nft``, else nft on PATH, else /usr/sbin/nft (PATH under systemd may lack sbin)."""
    candidates = [configured] if configured else [shutil.which("nft") or "", "/usr/sbin/nft"]
    for path in candidates:
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    where = configured or "PATH or /usr/sbin/nft"
    raise ConfigError(
        f"firewall.enabled: nft not found ({where}); install the nftables package, "
        "or set firewall.enabled: false to leave the endpoint ports unguarded"
    )


Runner = Callable[[Sequence[str], float], "tuple[int, str]"]


def run_command(argv: Sequence[str], timeout_s: float) -> tuple[int, str]:
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return 124, f"{argv[0]} did not finish within {timeout_s:g} s"
    except OSError as e:
        return 127, f"cannot run {argv[0]}: {e.strerror}"
    return done.returncode, (done.stderr or done.stdout).strip()


class Firewall:
    """Applies the API's desired state when its version changes; keeps the old rules on any failure."""

    def __init__(
        self,
        cfg: FirewallConfig,
        state_dir: str | None,
        *,
        nft: Sequence[str] | None = None,
        runner: Runner = run_command,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.cfg = cfg
        self.nft = list(nft) if nft is not None else [find_nft(cfg.nft)]
        self.state_dir = state_dir
        self.runner = runner
        self.clock = clock
        self._lock = threading.Lock()
        self._applied_version: str | None = None
        self._pairs = 0
        self._last_ok: bool | None = None
        self._last_success_s: float | None = None
        self._applies_total = 0
        self._failures_total = 0
        self._last_error: str | None = None
        self._logged: tuple[str | None, str] | None = None  # (version, error) last logged, to log a repeat once
        self._warned_missing = False
        # one apply at a time: the reporter thread applies the API's rules, the agent's loop checks
        self._apply_lock = threading.RLock()
        self._in_force: tuple[str, str, int] | None = None  # (version, script, pairs) nft last accepted
        self._listing: str | None = None  # the table as nft listed it right after that apply
        self._restores_total = 0

    @property
    def applied_version(self) -> str | None:
        with self._lock:
            return self._applied_version

    def status(self) -> FirewallStatus:
        with self._lock:
            return FirewallStatus(self._applied_version, self._pairs, self._last_ok, self._last_success_s,
                                  self._applies_total, self._failures_total, self._last_error,
                                  self._restores_total)

    # -- the report response ----------------------------------------------------------------------

    def update(self, desired: Any) -> bool:
        """Called with each report response's ``firewall``; True when new rules were applied."""
        if desired is None:
            if not self._warned_missing:
                self._warned_missing = True
                log.warning("the API's report response carries no firewall; keeping the current endpoint rules "
                            "(an API older than the endpoint firewall?)")
            return False
        try:
            spec = parse_spec(desired)
        except FirewallSpecError as e:
            version = desired.get("version") if isinstance(desired, dict) else None
            self._failed(version if isinstance(version, str) else None, f"refused the API's firewall: {e}")
            return False
        with self._apply_lock:
            if spec.version == self.applied_version:
                return False
            return self._apply(spec.version, render(spec), spec.pairs)

    def check(self) -> bool:
        """Put the rules in force back when the table is not as the last apply left it (someone ran
        ``nft flush table``/``delete table``, or another tool replaced it). True when it restored."""
        with self._apply_lock:
            if self._in_force is None:
                return False  # nothing applied since the agent started: nothing to keep
            listing = self._list_table()
            if listing is not None and listing == self._listing:
                return False
            version, script, pairs = self._in_force
            what = "is gone" if listing is None else "was changed"
            log.warning("endpoint firewall: table inet %s %s outside the agent (nft flush/delete?); "
                        "the guarded ports were open; restoring version %s", TABLE, what, version[:12])
            restored = self._apply(version, script, pairs, restoring=True)
            if restored:
                with self._lock:
                    self._restores_total += 1
            return restored

    def _list_table(self) -> str | None:
        """The table as nft lists it without counters; None when it is missing (or nft fails)."""
        rc, output = self.runner([*self.nft, "-s", "list", "table", "inet", TABLE], self.cfg.timeout_s)
        return output if rc == 0 else None

    def restore(self) -> bool:
        """At start: apply the script applied last (a reboot lost the table) until the API answers."""
        path = self._path(SCRIPT_NAME)
        if path is None or not os.path.exists(path):
            return False
        try:
            with open(path, encoding="utf-8") as f:
                script = f.read()
        except OSError as e:
            log.error("cannot read the saved endpoint firewall %s: %s", path, e.strerror)
            return False
        version, pairs = VERSION_LINE.search(script), PAIRS_LINE.search(script)
        return self._apply(version.group(1) if version else "restored", script, int(pairs.group(1)) if pairs else 0,
                           restoring=True)

    # -- applying ---------------------------------------------------------------------------------

    def _path(self, name: str) -> str | None:
        return os.path.join(self.state_dir, name) if self.state_dir else None

    def _apply(self, version: str, script: str, pairs: int, *, restoring: bool = False) -> bool:
        with self._apply_lock:
            return self._apply_locked(version, script, pairs, restoring=restoring)

    def _apply_locked(self, version: str, script: str, pairs: int, *, restoring: bool) -> bool:
        with self._lock:
            before = self._applied_version
        target = self._path(SCRIPT_NAME)
        try:
            if self.state_dir:
                os.makedirs(self.state_dir, exist_ok=True)
            if self.state_dir:
                tmp = os.path.join(self.state_dir, NEW_NAME)  # one applier (the reporter thread): a fixed name
                with open(tmp, "w", encoding="utf-8") as f:
                    f.write(script)
            else:
                fd, tmp = tempfile.mkstemp(prefix="dlts-firewall.", suffix=".nft")
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    f.write(script)
        except OSError as e:
            self._failed(version, f"cannot write the nft script: {e.strerror}")
            return False
        try:
            rc, output = self.runner([*self.nft, "-f", tmp], self.cfg.timeout_s)
            if rc != 0:
                failed = self._path(FAILED_NAME) if not restoring else None
                if failed:
                    os.replace(tmp, failed)  # kept for the operator; nft's line numbers refer to it
                    output = output.replace(tmp, failed)
                self._failed(version, f"nft -f exited with {rc}: {output[:2000]}")
                return False
            if target and not restoring:
                os.replace(tmp, target)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        with self._lock:
            self._applied_version = version
            self._pairs = pairs
            self._last_ok = True
            self._last_success_s = self.clock()
            self._applies_total += 1
            self._last_error = None
            self._logged = None
        self._in_force = (version, script, pairs)
        self._listing = self._list_table()
        low_high = re.search(r"TCP ports (\S+);", script)
        log.info("endpoint firewall %s: version %s, %d (source, port) pair(s) may reach TCP %s%s",
                 "restored" if restoring else "applied", version[:12], pairs, low_high.group(1) if low_high else "?",
                 f" (was {before[:12]})" if before else "")
        return True

    def _failed(self, version: str | None, error: str) -> None:
        with self._lock:
            self._last_ok = False
            self._failures_total += 1
            self._last_error = error
            repeat = self._logged == (version, error)
            self._logged = (version, error)
            kept = self._applied_version
        if not repeat:  # the same failure comes back with every report; say it once
            log.error("endpoint firewall not changed (%s); the rules of version %s stay in force", error,
                      kept[:12] if kept else "(none applied since the agent started)")
