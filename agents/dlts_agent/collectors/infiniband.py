"""InfiniBand collector: port state, rate, data and error counters from /sys/class/infiniband."""

from __future__ import annotations

import os
import re

from dlts_agent.model import IbPortSample

# Counters under ports/N/counters/ that count errors (names as the kernel's ib_core exports them)
ERROR_COUNTERS = (
    "symbol_error",
    "link_error_recovery",
    "link_downed",
    "port_rcv_errors",
    "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors",
    "port_xmit_discards",
    "port_xmit_constraint_errors",
    "port_rcv_constraint_errors",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
    "VL15_dropped",
)
_RATE_RE = re.compile(r"^\s*([0-9.]+)\s*Gb/sec")
# port_xmit_data / port_rcv_data count 32-bit words (IBA spec), not bytes
_DATA_WORD_BYTES = 4


class InfinibandCollector:
    name = "infiniband"

    def __init__(self, sys_root: str = "/sys", ignore_ports: tuple[str, ...] = ()) -> None:
        self.base = os.path.join(sys_root, "class", "infiniband")
        self.ignore = set(ignore_ports)

    def collect(self) -> tuple[tuple[IbPortSample, ...], list[str]]:
        errors: list[str] = []
        if not os.path.isdir(self.base):
            return (), errors  # no HCA: nothing to report, and nothing wrong
        ports: list[IbPortSample] = []
        for dev in sorted(os.listdir(self.base)):
            ports_dir = os.path.join(self.base, dev, "ports")
            try:
                names = sorted(os.listdir(ports_dir))
            except OSError as e:
                errors.append(f"{dev}: cannot list ports: {e.strerror}")
                continue
            for pname in names:
                if not pname.isdigit():
                    errors.append(f"{dev}: unexpected port entry {pname!r}")
                    continue
                if f"{dev}/{pname}" in self.ignore:
                    continue
                sample = self._port(dev, int(pname), os.path.join(ports_dir, pname), errors)
                if sample is not None:
                    ports.append(sample)
        return tuple(ports), errors

    def _port(self, dev: str, port: int, path: str, errors: list[str]) -> IbPortSample | None:
        where = f"{dev}/{port}"
        state_text = _read(os.path.join(path, "state"))
        if state_text is None:
            errors.append(f"{where}: state unreadable")
            return None
        state = _enum_name(state_text)
        if state is None:
            errors.append(f"{where}: malformed state {state_text!r}")
            return None
        phys = _read(os.path.join(path, "phys_state"))
        rate = None
        rate_text = _read(os.path.join(path, "rate"))
        if rate_text is not None:
            m = _RATE_RE.match(rate_text)
            if m:
                rate = float(m.group(1)) * 1e9 / 8
            else:
                errors.append(f"{where}: malformed rate {rate_text!r}")
        counters_dir = os.path.join(path, "counters")
        tx = _int(os.path.join(counters_dir, "port_xmit_data"), where, errors)
        rx = _int(os.path.join(counters_dir, "port_rcv_data"), where, errors)
        errs: dict[str, int] = {}
        for name in ERROR_COUNTERS:
            v = _int(os.path.join(counters_dir, name), where, errors)
            if v is not None:
                errs[name] = v
        return IbPortSample(
            device=dev,
            port=port,
            state=state,
            phys_state=_enum_name(phys) if phys else None,
            link_layer=_read(os.path.join(path, "link_layer")),
            rate_bytes_per_second=rate,
            transmitted_bytes=tx * _DATA_WORD_BYTES if tx is not None else None,
            received_bytes=rx * _DATA_WORD_BYTES if rx is not None else None,
            errors=errs,
        )

    def close(self) -> None:
        pass


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return None


def _enum_name(text: str) -> str | None:
    """'4: ACTIVE' -> 'ACTIVE', '5: LinkUp' -> 'LINKUP'."""
    num, sep, name = text.partition(":")
    if not sep or not num.strip().isdigit() or not name.strip():
        return None
    return name.strip().upper()


def _int(path: str, where: str, errors: list[str]) -> int | None:
    text = _read(path)
    if text is None:
        return None  # counter not present on this HCA: no data
    try:
        value = int(text)
    except ValueError:
        errors.append(f"{where}: malformed counter {os.path.basename(path)}={text!r}")
        return None
    if value < 0:
        errors.append(f"{where}: negative counter {os.path.basename(path)}={value}")
        return None
    return value
