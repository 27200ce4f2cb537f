"""Host collector: CPU time, memory, load, filesystem usage of configured mounts, network bytes."""

from __future__ import annotations

import os

import psutil

from dlts_agent.model import FilesystemSample, HostSample

# /proc/stat's cpu columns, in order (proc(5)); older kernels have fewer
CPU_MODES = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal", "guest", "guest_nice")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def read_cpu_times(proc_root: str) -> tuple[dict[str, float], int]:
    """Seconds per CPU mode over all CPUs, and the number of CPUs, from ``<proc_root>/stat``."""
    total: dict[str, float] = {}
    count = 0
    with open(os.path.join(proc_root, "stat"), encoding="ascii") as f:
        for line in f:
            name, _, rest = line.partition(" ")
            if name == "cpu":
                total = {mode: int(v) / CLOCK_TICKS for mode, v in zip(CPU_MODES, rest.split())}
            elif name.startswith("cpu") and name[3:].isascii() and name[3:].isdigit():
                count += 1
    if not total:
        raise ValueError("no cpu line")
    return total, count


def read_memory(proc_root: str) -> tuple[int, int]:
    """Total and available bytes from ``<proc_root>/meminfo`` (MemAvailable, or free + buffers +
    cached on kernels without it)."""
    fields: dict[str, int] = {}
    with open(os.path.join(proc_root, "meminfo"), encoding="ascii") as f:
        for line in f:
            key, _, rest = line.partition(":")
            value = rest.split()
            if value:
                fields[key] = int(value[0]) * 1024
    available = fields.get("MemAvailable")
    if available is None:
        available = fields.get("MemFree", 0) + fields.get("Buffers", 0) + fields.get("Cached", 0)
    return fields["MemTotal"], available


def read_network(proc_root: str) -> dict[str, tuple[int, int]]:
    """Received and sent bytes per interface from ``<proc_root>/net/dev``."""
    out: dict[str, tuple[int, int]] = {}
    with open(os.path.join(proc_root, "net", "dev"), encoding="ascii") as f:
        for line in f.readlines()[2:]:
            name, _, rest = line.partition(":")
            counters = rest.split()
            if len(counters) < 16:
                raise ValueError(f"net/dev: {name.strip()} has {len(counters)} counters, not 16")
            out[name.strip()] = (int(counters[0]), int(counters[8]))
    return out


class HostCollector:
    name = "host"

    def __init__(self, proc_root: str = "/proc", mounts: tuple[str, ...] = ("/",)) -> None:
        self.proc_root = proc_root
        self.mounts = mounts

    def collect(self) -> tuple[HostSample, list[str]]:
        """Read from ``proc_root`` directly (never by switching psutil's process-wide PROCFS_PATH,
        which every other thread of the process, and in tests the job manager, reads too)."""
        errors: list[str] = []
        cpu, cpu_count = read_cpu_times(self.proc_root)
        memory_total, memory_available = read_memory(self.proc_root)
        net = read_network(self.proc_root)
        loads: list[float | None] = [None, None, None]
        try:
            with open(os.path.join(self.proc_root, "loadavg"), encoding="ascii") as f:
                parts = f.read().split()
            loads = [float(p) for p in parts[:3]]
            if len(loads) != 3:
                raise ValueError("fewer than 3 fields")
        except (OSError, ValueError) as e:
            loads = [None, None, None]
            errors.append(f"{self.proc_root}/loadavg unreadable: {e}")
        filesystems = []
        for mount in self.mounts:
            try:
                du = psutil.disk_usage(mount)
            except OSError as e:
                errors.append(f"filesystem {mount}: {e.strerror or e}")
                continue
            try:
                st = os.statvfs(mount)
                inodes = int(st.f_favail) if st.f_files > 0 else None
            except OSError:
                inodes = None
            filesystems.append(FilesystemSample(mount, int(du.total), int(du.free), int(du.used), inodes))
        network = {dev: counters for dev, counters in net.items() if dev != "lo"}
        sample = HostSample(
            cpu_seconds=cpu,
            cpu_count=cpu_count,
            memory_total_bytes=memory_total,
            memory_available_bytes=memory_available,
            load1=loads[0],
            load5=loads[1],
            load15=loads[2],
            filesystems=tuple(filesystems),
            network=network,
        )
        return sample, errors

    def close(self) -> None:
        pass
