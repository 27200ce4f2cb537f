"""A stateful fake of the pynvml module: the NVML seam for tests, the demo and the benchmark.

It answers the same calls as nvidia-ml-py with the same types (pynvml's ctypes structures, its
``NVMLError`` subclasses chosen by return code) so that ``dlts_agent.nvml.Nvml`` cannot tell the
difference. State changes the way the driver's does: a GPU reset clears volatile ECC counters and
applies a pending row remap; an XID is queued for ``nvmlEventSetWait``; a GPU that fell off the bus
answers ``NVML_ERROR_GPU_IS_LOST`` to everything.

Named scenarios (``scenario(name)``) cover the cases the agent must recognise. Never used unless
a test, ``dlts-agent --fake-nvml SCENARIO``, ``dlts demo --fake-nvml SCENARIO`` or the benchmark
asks for it; both commands refuse it where ``dlts_agent.nvml.real_gpu_devices()`` finds devices.
It lives in ``dlts_testing``, not in the agent's package: the product does not carry its fakes.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml

from dlts_agent.nvml import NVML_FI_DEV_GET_GPU_RECOVERY_ACTION

NVMLError = pynvml.NVMLError
# Newer nvidia-ml-py names the PCI info structure nvmlPciInfo_t, older releases c_nvmlPciInfo_t.
_PCI_INFO = getattr(pynvml, "nvmlPciInfo_t", None) or pynvml.c_nvmlPciInfo_t
GiB = 1024**3

CORRECTED, UNCORRECTED = 0, 1
VOLATILE, AGGREGATE = 0, 1


@dataclass
class FakeGpu:
    """One GPU's driver-visible state. ``None`` for a field means NVML_ERROR_NOT_SUPPORTED."""

    uuid: str
    bus_id: str  # NVML form "00000000:07:00.0"
    name: str = "NVIDIA A100-SXM4-80GB"
    memory_total_bytes: int | None = 80 * GiB
    memory_used_bytes: int | None = 1 * GiB
    utilization_pct: int | None = 0
    temperature_c: int | None = 34
    power_mw: int | None = 61_000
    clocks_event_reasons: int | None = 0x1  # GPU idle
    # (error type, counter type) -> count, or None when ECC is unsupported on this board
    ecc: dict[tuple[int, int], int] | None = field(
        default_factory=lambda: {
            (CORRECTED, VOLATILE): 0,
            (CORRECTED, AGGREGATE): 0,
            (UNCORRECTED, VOLATILE): 0,
            (UNCORRECTED, AGGREGATE): 0,
        }
    )
    # (correctable rows, uncorrectable rows, pending, failure); None before Ampere
    remapped_rows: tuple[int, int, int, int] | None = (0, 0, 0, 0)
    retired_sbe: list[int] | None = None  # page addresses; None on Ampere+ (NOT_SUPPORTED)
    retired_dbe: list[int] | None = None
    retired_pending: int | None = None
    recovery_action: int | None = 0  # None before driver r570
    pids: list[int] = field(default_factory=list)
    lost: bool = False
    xid_events_supported: bool = True


class FakeNvmlLib:
    """Module-shaped fake: pass it where ``pynvml`` would go (``Nvml(lib=FakeNvmlLib(...))``)."""

    NVMLError = pynvml.NVMLError
    is_fake = True  # the agent marks its reports as fake (the API ignores their findings outside the demo)

    def __init__(
        self, gpus: list[FakeGpu], *, init_error: int | None = None, driver_version: str = "550.127.05"
    ) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.driver_version = driver_version
        self._initialised = 0
        self._lock = threading.Lock()
        self._events: deque[tuple[int, int]] = deque()  # (gpu index, xid)
        self._registered: set[int] = set()
        self.resets: list[int] = []
        self.calls = 0

    # -- state changes the tests drive ----------------------------------------------------------

    def inject_xid(self, index: int, xid: int) -> None:
        with self._lock:
            self._events.append((index, xid))

    def fall_off_bus(self, index: int) -> None:
        self.gpus[index].lost = True

    def reset_gpu(self, index: int) -> None:
        """What `nvidia-smi --gpu-reset` does to the counters: volatile cleared, pending remap applied."""
        g = self.gpus[index]
        if g.lost:
            raise NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        if g.ecc is not None:
            g.ecc[(CORRECTED, VOLATILE)] = 0
            g.ecc[(UNCORRECTED, VOLATILE)] = 0
        if g.remapped_rows is not None:
            c, u, _pending, failure = g.remapped_rows
            g.remapped_rows = (c, u, 0, failure)
        if g.retired_pending is not None:
            g.retired_pending = 0
        if g.recovery_action:
            g.recovery_action = 0
        self.resets.append(index)

    # -- helpers --------------------------------------------------------------------------------

    def _check(self) -> None:
        self.calls += 1
        if not self._initialised:
            raise NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)

    def _gpu(self, handle: Any) -> FakeGpu:
        self._check()
        g = self.gpus[handle.index]
        if g.lost:
            raise NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return g

    @staticmethod
    def _supported(value: Any) -> Any:
        if value is None:
            raise NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return value

    # -- the pynvml surface ---------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self.calls += 1
        if self.init_error is not None:
            raise NVMLError(self.init_error)
        self._initialised += 1

    def nvmlShutdown(self) -> None:
        self._check()
        self._initialised -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._check()
        return self.driver_version

    def nvmlDeviceGetCount(self) -> int:
        self._check()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        self._check()
        if not 0 <= index < len(self.gpus):
            raise NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return _Handle(index)

    def nvmlDeviceGetUUID(self, h: Any) -> str:
        return self._gpu(h).uuid

    def nvmlDeviceGetName(self, h: Any) -> str:
        return self._gpu(h).name

    def nvmlDeviceGetPciInfo(self, h: Any) -> Any:
        g = self._gpu(h)
        info = _PCI_INFO()
        info.busId = g.bus_id.encode()
        info.busIdLegacy = g.bus_id.encode()
        domain, bus, devfn = g.bus_id.split(":")
        info.domain, info.bus, info.device = int(domain, 16), int(bus, 16), int(devfn.split(".")[0], 16)
        return info

    def nvmlDeviceGetUtilizationRates(self, h: Any) -> Any:
        pct = self._supported(self._gpu(h).utilization_pct)
        return pynvml.c_nvmlUtilization_t(gpu=pct, memory=pct // 2)

    def nvmlDeviceGetMemoryInfo(self, h: Any, version: Any = None) -> Any:
        g = self._gpu(h)
        total = self._supported(g.memory_total_bytes)
        used = self._supported(g.memory_used_bytes)
        return pynvml.c_nvmlMemory_t(total=total, free=total - used, used=used)

    def nvmlDeviceGetTemperature(self, h: Any, sensor: int) -> int:
        return self._supported(self._gpu(h).temperature_c)

    def nvmlDeviceGetPowerUsage(self, h: Any) -> int:
        return self._supported(self._gpu(h).power_mw)

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: Any) -> int:
        return self._supported(self._gpu(h).clocks_event_reasons)

    def nvmlDeviceGetTotalEccErrors(self, h: Any, error_type: int, counter_type: int) -> int:
        ecc = self._supported(self._gpu(h).ecc)
        return ecc[(error_type, counter_type)]

    def nvmlDeviceGetRemappedRows(self, h: Any) -> tuple[int, int, int, int]:
        return self._supported(self._gpu(h).remapped_rows)

    def nvmlDeviceGetRetiredPages(self, h: Any, cause: int) -> list[int]:
        g = self._gpu(h)
        pages = g.retired_sbe if cause == 0 else g.retired_dbe
        return list(self._supported(pages))

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h: Any) -> int:
        return self._supported(self._gpu(h).retired_pending)

    def nvmlDeviceGetFieldValues(self, h: Any, field_ids: list[int]) -> Any:
        g = self._gpu(h)
        values = (pynvml.c_nvmlFieldValue_t * len(field_ids))()
        for i, fid in enumerate(field_ids):
            values[i].fieldId = fid
            if fid == NVML_FI_DEV_GET_GPU_RECOVERY_ACTION and g.recovery_action is not None:
                values[i].nvmlReturn = pynvml.NVML_SUCCESS
                values[i].valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
                values[i].value.uiVal = g.recovery_action
            else:
                values[i].nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return values

    def nvmlDeviceGetComputeRunningProcesses(self, h: Any) -> list[Any]:
        g = self._gpu(h)
        return [
            pynvml.nvmlFriendlyObject(
                {"pid": pid, "usedGpuMemory": GiB, "gpuInstanceId": 0xFFFFFFFF, "computeInstanceId": 0xFFFFFFFF}
            )
            for pid in g.pids
        ]

    def nvmlEventSetCreate(self) -> Any:
        self._check()
        return _EventSet()

    def nvmlDeviceGetSupportedEventTypes(self, h: Any) -> int:
        g = self._gpu(h)
        return pynvml.nvmlEventTypeXidCriticalError | 0x1 if g.xid_events_supported else 0x1

    def nvmlDeviceRegisterEvents(self, h: Any, event_types: int, event_set: Any) -> None:
        g = self._gpu(h)
        if not g.xid_events_supported:
            raise NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        self._registered.add(h.index)

    def nvmlEventSetWait(self, event_set: Any, timeout_ms: int) -> Any:
        self._check()
        with self._lock:
            while self._events:
                index, xid = self._events.popleft()
                if index in self._registered:
                    return SimpleNamespace(
                        device=_Handle(index),
                        eventType=pynvml.nvmlEventTypeXidCriticalError,
                        eventData=xid,
                        gpuInstanceId=0xFFFFFFFF,
                        computeInstanceId=0xFFFFFFFF,
                    )
        raise NVMLError(pynvml.NVML_ERROR_TIMEOUT)

    def nvmlEventSetFree(self, event_set: Any) -> None:
        self._check()


@dataclass(frozen=True)
class _Handle:
    index: int


class _EventSet:
    pass


class DeferredFaults:
    """A scenario whose GPU faults appear only once each faulty GPU is in use (the demo's story:
    a job runs on GPU 3, then GPU 3 fails and the job is moved off). ``lib`` starts with every GPU
    of the scenario healthy (counters zero, nothing lost, no queued XID); ``use(index)`` gives GPU
    ``index`` the scenario's state and queues its XIDs, once."""

    def __init__(self, faulty: FakeNvmlLib) -> None:
        self.faulty = faulty
        self.lib = FakeNvmlLib([_healthy_copy(g) for g in faulty.gpus], init_error=faulty.init_error,
                               driver_version=faulty.driver_version)
        with faulty._lock:
            events = list(faulty._events)
        self._xids: dict[int, list[int]] = {}
        for index, xid in events:
            self._xids.setdefault(index, []).append(xid)
        self.pending = {i for i, g in enumerate(faulty.gpus) if g != self.lib.gpus[i] or i in self._xids}

    def use(self, index: int) -> bool:
        """GPU ``index`` runs a job: its fault (if any, and not yet shown) appears. True when it did."""
        if index not in self.pending:
            return False
        self.pending.discard(index)
        self.lib.gpus[index] = self.faulty.gpus[index]
        for xid in self._xids.get(index, []):
            self.lib.inject_xid(index, xid)
        return True


def _healthy_copy(g: FakeGpu) -> FakeGpu:
    return dataclasses.replace(
        g,
        ecc=None if g.ecc is None else dict.fromkeys(g.ecc, 0),
        remapped_rows=None if g.remapped_rows is None else (0, 0, 0, 0),
        retired_sbe=None if g.retired_sbe is None else [],
        retired_dbe=None if g.retired_dbe is None else [],
        retired_pending=None if g.retired_pending is None else 0,
        recovery_action=None if g.recovery_action is None else 0,
        lost=False,
    )


# ---------------------------------------------------------------------------------------------
# Named scenarios


def _a100(i: int) -> FakeGpu:
    return FakeGpu(
        uuid=f"GPU-a100{i:04d}-5c1e-4b3a-9f00-00000000000{i}",
        bus_id=f"00000000:{(0x07, 0x0F, 0x47, 0x4E, 0x87, 0x90, 0xB7, 0xBD)[i % 8]:02X}:00.0",
        utilization_pct=87,
        memory_used_bytes=61 * GiB,
        temperature_c=52,
        power_mw=312_000,
        clocks_event_reasons=0,
    )


def healthy_8xa100() -> FakeNvmlLib:
    return FakeNvmlLib([_a100(i) for i in range(8)])


def dbe_gpu3() -> FakeNvmlLib:
    lib = healthy_8xa100()
    lib.gpus[3].ecc = {
        (CORRECTED, VOLATILE): 12,
        (CORRECTED, AGGREGATE): 40,
        (UNCORRECTED, VOLATILE): 2,
        (UNCORRECTED, AGGREGATE): 2,
    }
    lib.gpus[3].remapped_rows = (0, 1, 1, 0)
    lib.inject_xid(3, 48)
    return lib


def remap_pending() -> FakeNvmlLib:
    lib = healthy_8xa100()
    lib.gpus[1].remapped_rows = (2, 1, 1, 0)
    return lib


def remap_failure() -> FakeNvmlLib:
    lib = healthy_8xa100()
    lib.gpus[6].remapped_rows = (3, 9, 0, 1)
    return lib


def retired_pages_v100() -> FakeNvmlLib:
    """8 V100s (pre-Ampere: page retirement, no row remapper); GPU 2 has 14 retired pages."""
    gpus = []
    for i in range(8):
        g = _a100(i)
        g.name = "Tesla V100-SXM2-32GB"
        g.uuid = g.uuid.replace("a100", "v100")
        g.memory_total_bytes = 32 * GiB
        g.memory_used_bytes = 20 * GiB
        g.remapped_rows = None
        g.recovery_action = None
        g.retired_sbe, g.retired_dbe, g.retired_pending = [], [], 0
        gpus.append(g)
    gpus[2].retired_sbe = [0x1000 * k for k in range(11)]
    gpus[2].retired_dbe = [0x9_0000, 0x9_1000, 0x9_2000]
    gpus[2].retired_pending = 1
    return FakeNvmlLib(gpus, driver_version="535.216.01")


def fallen_off_bus() -> FakeNvmlLib:
    lib = healthy_8xa100()
    lib.fall_off_bus(5)
    return lib


def not_supported() -> FakeNvmlLib:
    """Two consumer boards where every health field answers NOT_SUPPORTED."""
    gpus = []
    for i in range(2):
        gpus.append(
            FakeGpu(
                uuid=f"GPU-rtx0{i}-0000-0000-0000-000000000000",
                bus_id=f"00000000:0{i + 1}:00.0",
                name="NVIDIA GeForce RTX 3090",
                memory_total_bytes=None,
                memory_used_bytes=None,
                utilization_pct=None,
                temperature_c=None,
                power_mw=None,
                clocks_event_reasons=None,
                ecc=None,
                remapped_rows=None,
                retired_sbe=None,
                retired_dbe=None,
                retired_pending=None,
                recovery_action=None,
                xid_events_supported=False,
            )
        )
    return FakeNvmlLib(gpus)


def init_failure() -> FakeNvmlLib:
    return FakeNvmlLib([], init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)


SCENARIOS: dict[str, Callable[[], FakeNvmlLib]] = {
    "healthy-8xa100": healthy_8xa100,
    "dbe-gpu3": dbe_gpu3,
    "remap-pending": remap_pending,
    "remap-failure": remap_failure,
    "retired-pages": retired_pages_v100,
    "fallen-off-bus": fallen_off_bus,
    "not-supported": not_supported,
    "init-failure": init_failure,
}


class FakeDriver:
    """The agent's command runner for a fake-NVML node (the demo): ``nvidia-smi --gpu-reset`` does
    to the fake GPU what the driver does (volatile ECC cleared, a pending remap applied); a reboot
    is refused, since a demo cannot reboot the machine it runs on."""

    def __init__(self, lib: FakeNvmlLib) -> None:
        self.lib = lib
        self.commands: list[list[str]] = []

    def __call__(self, argv: list[str], timeout_s: float) -> tuple[int, str]:
        self.commands.append(list(argv))
        if "--gpu-reset" in argv:
            target = argv[-1]
            for index, g in enumerate(self.lib.gpus):
                if target in (g.uuid, str(index)):
                    try:
                        self.lib.reset_gpu(index)
                    except NVMLError:
                        return 255, f"GPU {target} is lost; a reset cannot reach it"
                    return 0, f"GPU {target} was successfully reset (fake NVML)."
            return 6, f"no GPU {target}"
        if argv[-1:] == ["reboot"]:
            return 1, "a fake-NVML node does not reboot (demo)"
        if argv[1:2] == ["diag"]:
            return fake_dcgmi_diag(self.lib, argv)
        return 0, ""


DEPLOYMENT_TESTS = ("Denylist", "NVML Library", "CUDA Main Library", "Permissions and OS-related Blocks",
                    "Persistence Mode", "Environmental Variables", "Page Retirement/Row Remap", "Graphics Processes",
                    "Inforom")


def fake_dcgmi_diag(lib: FakeNvmlLib, argv: list[str]) -> tuple[int, str]:
    """``dcgmi diag -r LEVEL -j [-i GPUS]`` over the fake GPUs, in DCGM 3's JSON document (the
    format docs/agent.md describes: the deployment tests, one result for the GPUs run on, nulls
    between the tests as DCGM 3 prints them). What fails: NVML Library when the driver does not
    load; Page Retirement/Row Remap on a pending or failed row remap or a pending page retirement;
    Graphics Processes when a GPU has processes. A lost GPU cannot be diagnosed at all."""
    gpus = list(range(len(lib.gpus)))
    if "-i" in argv:
        gpus = [int(x) for x in argv[argv.index("-i") + 1].split(",")]
    lost = [i for i in gpus if lib.gpus[i].lost]
    if lost:
        return 255, f"Error: Unable to run diagnostic: GPU {lost[0]} is not accessible (fake NVML)"
    ids = ",".join(map(str, gpus))
    failing: dict[str, list[str]] = {}
    if lib.init_error is not None:
        failing["NVML Library"] = [f"nvmlInit failed with error {lib.init_error}"]
    for i in gpus:
        g = lib.gpus[i]
        remap = g.remapped_rows or (0, 0, 0, 0)
        if remap[2] or remap[3] or g.retired_pending:
            what = "a row remapping failure" if remap[3] else "pending row remappings" if remap[2] else "pending page retirements"
            failing.setdefault("Page Retirement/Row Remap", []).append(f"GPU {i} has {what}; reset or reboot the GPU")
        if g.pids:
            failing.setdefault("Graphics Processes", []).append(f"GPU {i} is in use by processes {g.pids}")
    tests: list[dict | None] = []
    for name in DEPLOYMENT_TESTS:
        result: dict = {"gpu_ids": ids, "status": "FAIL" if name in failing else "PASS"}
        if name in failing:
            result["warnings"] = failing[name]
        tests += [{"name": name, "results": [result]}, None]
    doc = {"DCGM GPU Diagnostic": {"test_categories": [{"category": "Deployment", "tests": tests[:-1]}],
                                   "version": "3.3.9"}}
    return (1 if failing else 0), json.dumps(doc, indent=1)


def scenario(name: str) -> FakeNvmlLib:
    try:
        return SCENARIOS[name]()
    except KeyError:
        raise ValueError(f"unknown fake NVML scenario {name!r}; choose one of {', '.join(SCENARIOS)}") from None
