"""Host collector: CPU time, memory, load, filesystem usage of configured mounts, network bytes."""

from __future__ import annotations

import os

import psutil

from dlts_agent.model import FilesystemSample, HostSample


class HostCollector:
    name = "host"

    def __init__(self, proc_root: str = "/proc", mounts: tuple[str, ...] = ("/",)) -> None:
        self.proc_root = proc_root
        self.mounts = mounts

    def collect(self) -> tuple[HostSample, list[str]]:
        errors: list[str] = []
        saved = psutil.PROCFS_PATH
        psutil.PROCFS_PATH = self.proc_root  # psutil reads /proc through this module setting
        try:
            times = psutil.cpu_times()
            per_cpu = psutil.cpu_times(percpu=True)
            mem = psutil.virtual_memory()
            net = psutil.net_io_counters(pernic=True)
        finally:
            psutil.PROCFS_PATH = saved
        cpu = {mode: float(getattr(times, mode)) for mode in times._fields}
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
            filesystems.append(FilesystemSample(mount, int(du.total), int(du.free), int(du.used)))
        network: dict[str, tuple[int, int]] = {
            dev: (int(c.bytes_recv), int(c.bytes_sent)) for dev, c in net.items() if dev != "lo"
        }
        sample = HostSample(
            cpu_seconds=cpu,
            cpu_count=len(per_cpu),
            memory_total_bytes=int(mem.total),
            memory_available_bytes=int(mem.available),
            load1=loads[0],
            load5=loads[1],
            load15=loads[2],
            filesystems=tuple(filesystems),
            network=network,
        )
        return sample, errors

    def close(self) -> None:
        pass
