"""The one module that talks to NVML.

``Nvml`` takes the NVML library as a constructor argument: the real ``pynvml`` module from
nvidia-ml-py in production, ``dlts_testing.fake_nvml.FakeNvmlLib`` in tests and demos. Nothing else in
the agent imports pynvml.

Rules (as gpustat does): a field the GPU does not support is ``None``, never 0; a GPU that is lost
(NVML_ERROR_GPU_IS_LOST, fallen off the bus) becomes a placeholder sample with ``lost=True``; nothing
here raises except ``NvmlUnavailable`` when NVML itself cannot start.
"""

from __future__ import annotations

import ctypes
import glob
import logging
import os
from collections.abc import Callable
from typing import Any

from dlts_agent.model import GpuReadout, GpuSample

log = logging.getLogger(__name__)

# NVML return codes and constants (from nvml.h; identical in pynvml and the fake)
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_TEMPERATURE_GPU = 0
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1
NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS = 0
NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = 1
NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = 230
NVML_EVENT_TYPE_XID_CRITICAL_ERROR = 0x8

_ECC_KEYS = (
    ("corrected", "volatile", NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_VOLATILE_ECC),
    ("corrected", "aggregate", NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_AGGREGATE_ECC),
    ("uncorrected", "volatile", NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC),
    ("uncorrected", "aggregate", NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_AGGREGATE_ECC),
)


class NvmlUnavailable(RuntimeError):
    """NVML could not start (no driver, no library, init failure). The message says which."""


class _GpuLost(Exception):
    pass


def real_gpu_devices(dev: str = "/dev") -> list[str]:
    """NVIDIA device nodes of this machine. Where they exist, ``dlts-agent --fake-nvml`` and
    ``dlts demo --fake-nvml`` refuse the fake NVML (``dlts_testing.fake_nvml``): a node with GPUs
    reports what its driver says."""
    return sorted(glob.glob(os.path.join(dev, "nvidia[0-9]*")))


def normalize_bus_id(raw: str | bytes | None) -> str | None:
    """'00000000:65:00.0', 'PCI:0000:65:00', '0000:65:00.0' -> '0000:65:00.0' (lower case)."""
    if raw is None:
        return None
    text = raw.decode("ascii", "replace") if isinstance(raw, bytes) else str(raw)
    text = text.strip().lower()
    if text.startswith("pci:"):
        text = text[4:]
    parts = text.split(":")
    try:
        if len(parts) == 3:
            domain, bus, devfn = parts
        elif len(parts) == 2:
            domain, (bus, devfn) = "0", parts
        else:
            return text or None
        dev, _, fn = devfn.partition(".")
        return f"{int(domain, 16):04x}:{int(bus, 16):02x}:{int(dev, 16):02x}.{int(fn or '0', 16):x}"
    except ValueError:
        return text or None


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def load_pynvml() -> Any:
    """The real library. Imported lazily so that a node without nvidia-ml-py still runs the agent."""
    try:
        import pynvml
    except ImportError as e:
        raise NvmlUnavailable(
            f"nvidia-ml-py is not installed ({e}); install the agent extra: pip install 'dlts[agent]'"
        ) from None
    return pynvml


class Nvml:
    """Owns an NVML session: init once, re-enumerate when the GPU count changes, read, shut down."""

    def __init__(self, lib: Any | Callable[[], Any] | None = None) -> None:
        self._lib_factory = lib if callable(lib) and not hasattr(lib, "nvmlInit") else None
        self._lib = lib if lib is not None and self._lib_factory is None else None
        self._started = False
        self._handles: list[Any] = []
        self._known: dict[int, tuple[str | None, str | None, str | None]] = {}  # index -> uuid, bus, name
        self._event_set: Any = None
        self._handle_index: dict[Any, int] = {}
        self.driver_version: str | None = None

    # -- lifecycle ------------------------------------------------------------------------------

    @property
    def lib(self) -> Any:
        if self._lib is None:
            self._lib = self._lib_factory() if self._lib_factory else load_pynvml()
        return self._lib

    def start(self) -> None:
        if self._started:
            return
        lib = self.lib
        try:
            lib.nvmlInit()
        except lib.NVMLError as e:
            raise NvmlUnavailable(f"NVML init failed: {e} (is the NVIDIA driver loaded?)") from None
        self._started = True
        try:
            self.driver_version = _text(lib.nvmlSystemGetDriverVersion())
        except lib.NVMLError:
            self.driver_version = None
        self._enumerate()

    def close(self) -> None:
        if not self._started:
            return
        lib = self.lib
        if self._event_set is not None:
            try:
                lib.nvmlEventSetFree(self._event_set)
            except lib.NVMLError:
                pass
            self._event_set = None
        try:
            lib.nvmlShutdown()
        except lib.NVMLError:
            pass
        self._started = False

    def _enumerate(self) -> None:
        lib = self.lib
        count = lib.nvmlDeviceGetCount()
        self._handles = []
        self._handle_index = {}
        for i in range(count):
            try:
                h = lib.nvmlDeviceGetHandleByIndex(i)
            except lib.NVMLError:
                h = None  # lost before we could even get a handle; read() reports it
            self._handles.append(h)
            if h is not None:
                self._handle_index[_handle_key(h)] = i
                self._learn_identity(i, h)
        self._register_events()

    def _learn_identity(self, index: int, h: Any) -> None:
        """uuid, bus id and name, so XID events and lost GPUs can be named even without read()."""
        try:
            uuid = self._opt(self.lib.nvmlDeviceGetUUID, h)
            pci = self._opt(self.lib.nvmlDeviceGetPciInfo, h)
            name = self._opt(self.lib.nvmlDeviceGetName, h)
        except _GpuLost:
            return
        self._known[index] = (
            _text(uuid) if uuid is not None else None,
            normalize_bus_id(getattr(pci, "busId", None)) if pci is not None else None,
            _text(name) if name is not None else None,
        )

    # -- reading --------------------------------------------------------------------------------

    def read(self) -> GpuReadout:
        """Every GPU NVML counts. Raises NvmlUnavailable only when NVML itself is unusable."""
        self.start()
        lib = self.lib
        try:
            count = lib.nvmlDeviceGetCount()
        except lib.NVMLError as e:
            raise NvmlUnavailable(f"nvmlDeviceGetCount failed: {e}") from None
        if count != len(self._handles):
            self._enumerate()
        gpus = tuple(self._read_one(i, h) for i, h in enumerate(self._handles))
        return GpuReadout(gpus=gpus, count=count, driver_version=self.driver_version)

    def _read_one(self, index: int, handle: Any) -> GpuSample:
        uuid, bus_id, name = self._known.get(index, (None, None, None))
        if handle is None:
            return GpuSample(index, uuid, bus_id, name, lost=True, lost_reason="no NVML handle")
        try:
            uuid = self._must(self.lib.nvmlDeviceGetUUID, handle, default=uuid)
            uuid = _text(uuid) if uuid is not None else None
            pci = self._must(self.lib.nvmlDeviceGetPciInfo, handle, default=None)
            if pci is not None:
                bus_id = normalize_bus_id(getattr(pci, "busId", None))
            nm = self._opt(self.lib.nvmlDeviceGetName, handle)
            name = _text(nm) if nm is not None else name
            self._known[index] = (uuid, bus_id, name)
            return self._read_fields(index, handle, uuid, bus_id, name)
        except _GpuLost as e:
            return GpuSample(index, uuid, bus_id, name, lost=True, lost_reason=str(e))

    def _read_fields(self, index: int, h: Any, uuid: str | None, bus_id: str | None, name: str | None) -> GpuSample:
        lib = self.lib
        util = self._opt(lib.nvmlDeviceGetUtilizationRates, h)
        mem = self._opt(lib.nvmlDeviceGetMemoryInfo, h)
        temp = self._opt(lib.nvmlDeviceGetTemperature, h, NVML_TEMPERATURE_GPU)
        power_mw = self._opt(lib.nvmlDeviceGetPowerUsage, h)
        reasons_fn = (
            getattr(lib, "nvmlDeviceGetCurrentClocksEventReasons", None)
            or lib.nvmlDeviceGetCurrentClocksThrottleReasons
        )
        reasons = self._opt(reasons_fn, h)
        ecc: dict[tuple[str, str], int] = {}
        for etype, ctype, e_code, c_code in _ECC_KEYS:
            v = self._opt(lib.nvmlDeviceGetTotalEccErrors, h, e_code, c_code)
            if v is not None:
                ecc[(etype, ctype)] = int(v)
        remap = self._opt(lib.nvmlDeviceGetRemappedRows, h)
        sbe = self._opt(lib.nvmlDeviceGetRetiredPages, h, NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS)
        dbe = self._opt(lib.nvmlDeviceGetRetiredPages, h, NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
        pending = self._opt(lib.nvmlDeviceGetRetiredPagesPendingStatus, h)
        recovery = self._recovery_action(h)
        procs = self._opt(lib.nvmlDeviceGetComputeRunningProcesses, h) or ()
        pids = tuple(sorted({int(p.pid) for p in procs if getattr(p, "pid", None) is not None}))
        return GpuSample(
            index=index,
            uuid=uuid,
            bus_id=bus_id,
            name=name,
            utilization_ratio=(util.gpu / 100.0) if util is not None else None,
            memory_used_bytes=int(mem.used) if mem is not None else None,
            memory_total_bytes=int(mem.total) if mem is not None else None,
            temperature_celsius=float(temp) if temp is not None else None,
            power_watts=(power_mw / 1000.0) if power_mw is not None else None,
            clocks_event_reasons=int(reasons) if reasons is not None else None,
            ecc_errors=ecc,
            remapped_rows_correctable=int(remap[0]) if remap is not None else None,
            remapped_rows_uncorrectable=int(remap[1]) if remap is not None else None,
            row_remap_pending=bool(remap[2]) if remap is not None else None,
            row_remap_failure=bool(remap[3]) if remap is not None else None,
            retired_pages_single_bit=len(sbe) if sbe is not None else None,
            retired_pages_double_bit=len(dbe) if dbe is not None else None,
            retired_pages_pending=bool(pending) if pending is not None else None,
            recovery_action=recovery,
            pids=pids,
        )

    def _recovery_action(self, h: Any) -> int | None:
        values = self._opt(self.lib.nvmlDeviceGetFieldValues, h, [NVML_FI_DEV_GET_GPU_RECOVERY_ACTION])
        if not values:
            return None
        v = values[0]
        if int(getattr(v, "nvmlReturn", NVML_ERROR_NOT_SUPPORTED)) != 0:
            return None  # the driver predates r570 or the field is not supported here
        return int(v.value.uiVal)

    def _opt(self, fn: Any, *args: Any) -> Any:
        """Call NVML; unsupported or failing -> None, lost GPU -> _GpuLost."""
        lib = self.lib
        try:
            return fn(*args)
        except lib.NVMLError as e:
            if getattr(e, "value", None) == NVML_ERROR_GPU_IS_LOST:
                raise _GpuLost(str(e)) from None
            if getattr(e, "value", None) != NVML_ERROR_NOT_SUPPORTED:
                log.debug("NVML %s failed: %s", getattr(fn, "__name__", fn), e)
            return None

    def _must(self, fn: Any, *args: Any, default: Any) -> Any:
        v = self._opt(fn, *args)
        return default if v is None else v

    # -- XID events -----------------------------------------------------------------------------

    def _register_events(self) -> None:
        lib = self.lib
        if self._event_set is None:
            try:
                self._event_set = lib.nvmlEventSetCreate()
            except lib.NVMLError as e:
                log.info("NVML event sets unavailable (%s); XIDs come from the kernel log only", e)
                return
        for i, h in enumerate(self._handles):
            if h is None:
                continue
            try:
                supported = lib.nvmlDeviceGetSupportedEventTypes(h)
                mask = NVML_EVENT_TYPE_XID_CRITICAL_ERROR & supported
                if mask:
                    lib.nvmlDeviceRegisterEvents(h, mask, self._event_set)
            except lib.NVMLError as e:
                log.debug("GPU %d: XID event registration failed: %s", i, e)

    def poll_xid_events(self, max_events: int = 1000) -> list[tuple[int | None, str | None, int]]:
        """Drain pending XID events without waiting: [(gpu index, bus id, xid)]."""
        if not self._started or self._event_set is None:
            return []
        lib = self.lib
        out: list[tuple[int | None, str | None, int]] = []
        for _ in range(max_events):
            try:
                data = lib.nvmlEventSetWait(self._event_set, 0)
            except lib.NVMLError as e:
                if getattr(e, "value", None) != NVML_ERROR_TIMEOUT:
                    log.debug("nvmlEventSetWait: %s", e)
                break
            if (
                not int(getattr(data, "eventType", NVML_EVENT_TYPE_XID_CRITICAL_ERROR))
                & NVML_EVENT_TYPE_XID_CRITICAL_ERROR
            ):
                continue
            index = self._handle_index.get(_handle_key(data.device))
            bus = self._known.get(index, (None, None, None))[1] if index is not None else None
            out.append((index, bus, int(data.eventData)))
        return out

    def handle_for_index(self, index: int) -> Any:
        return self._handles[index] if 0 <= index < len(self._handles) else None


def _handle_key(handle: Any) -> Any:
    """Real handles are ctypes pointers (a new Python object per call): key them by address."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return handle  # the fake's handles are plain hashable objects
