"""Detectors are pure: samples + thresholds in, findings out. Table-driven, one sentence per case."""

from __future__ import annotations

import dataclasses

import pytest

from dlts_agent.config import Thresholds
from dlts_agent.detectors import (
    XID_RULES,
    detect,
    detect_disk,
    detect_gpu,
    detect_ib,
    detect_nfs,
    detect_xid,
)
from dlts_agent.model import (
    Collection,
    CollectorResult,
    CollectorStatus,
    FilesystemSample,
    GpuReadout,
    GpuSample,
    HostSample,
    IbPortSample,
    NfsMountSample,
    XidEvent,
)
from dlts_agent.model import (
    FindingCode as C,
)
from dlts_agent.model import (
    RecommendedAction as A,
)
from dlts_agent.model import (
    Severity as S,
)

T = Thresholds()


def gpu(**kw) -> GpuSample:
    base = dict(index=0, uuid="GPU-0", bus_id="0000:07:00.0")
    base.update(kw)
    return GpuSample(**base)


def ecc(cv=0, ca=0, uv=0, ua=0) -> dict:
    return {
        ("corrected", "volatile"): cv,
        ("corrected", "aggregate"): ca,
        ("uncorrected", "volatile"): uv,
        ("uncorrected", "aggregate"): ua,
    }


GPU_CASES = [
    ("a healthy GPU has no finding", gpu(ecc_errors=ecc()), []),
    (
        "one uncorrected volatile ECC error asks for a reset",
        gpu(ecc_errors=ecc(uv=1)),
        [(C.GPU_ECC_UNCORRECTED, S.CRITICAL, A.RESET_GPU)],
    ),
    ("uncorrected errors only in the aggregate (old, InfoROM) count are not current", gpu(ecc_errors=ecc(ua=7)), []),
    (
        "a huge corrected total since driver load is critical",
        gpu(ecc_errors=ecc(cv=50_000_001)),
        [(C.GPU_ECC_CORRECTED_TOTAL, S.CRITICAL, A.RESET_GPU)],
    ),
    ("a large corrected aggregate alone is not a finding (totals, not rates)", gpu(ecc_errors=ecc(ca=10**9)), []),
    (
        "pending row remap asks for a reset",
        gpu(row_remap_pending=True),
        [(C.GPU_ROW_REMAP_PENDING, S.CRITICAL, A.RESET_GPU)],
    ),
    (
        "row remap failure asks for a ticket",
        gpu(row_remap_failure=True),
        [(C.GPU_ROW_REMAP_FAILURE, S.CRITICAL, A.TICKET)],
    ),
    (
        "more than 512 uncorrectable remapped rows asks for a ticket",
        gpu(remapped_rows_uncorrectable=513),
        [(C.GPU_ROW_REMAP_UNCORRECTABLE, S.CRITICAL, A.TICKET)],
    ),
    ("exactly 10 retired pages is still fine", gpu(retired_pages_single_bit=6, retired_pages_double_bit=4), []),
    (
        "11 retired pages is critical",
        gpu(retired_pages_single_bit=7, retired_pages_double_bit=4),
        [(C.GPU_RETIRED_PAGES, S.CRITICAL, A.TICKET)],
    ),
    (
        "a full retirement table with one pending is an RMA",
        gpu(retired_pages_single_bit=40, retired_pages_double_bit=22, retired_pages_pending=True),
        [(C.GPU_RETIREMENT_TABLE_FULL, S.CRITICAL, A.TICKET), (C.GPU_RETIRED_PAGES_PENDING, S.WARNING, A.REBOOT)],
    ),
    (
        "a pending retirement alone asks for a reboot",
        gpu(retired_pages_single_bit=1, retired_pages_double_bit=0, retired_pages_pending=True),
        [(C.GPU_RETIRED_PAGES_PENDING, S.WARNING, A.REBOOT)],
    ),
    ("NOT_SUPPORTED everywhere (None) is no data, not a finding", gpu(), []),
    (
        "recovery action DRAIN_AND_RESET asks for a reset",
        gpu(recovery_action=4),
        [(C.GPU_RECOVERY_ACTION, S.CRITICAL, A.RESET_GPU)],
    ),
    ("recovery action 0 is none", gpu(recovery_action=0), []),
    (
        "a lost GPU asks for a reboot and nothing else",
        gpu(lost=True, lost_reason="GPU is lost", row_remap_pending=True),
        [(C.GPU_LOST, S.CRITICAL, A.REBOOT)],
    ),
]


@pytest.mark.parametrize("case, sample, expected", GPU_CASES, ids=[c[0] for c in GPU_CASES])
def test_gpu_rules(case, sample, expected):
    assert [(f.code, f.severity, f.action) for f in detect_gpu(sample, None, 0.0, T)] == expected


@pytest.mark.parametrize(
    "prev, cur, dt_s, expect_rate_finding",
    [
        (1000, 1000 + 3000, 600, True),  # 18,000/h > 10,000/h
        (1000, 1000 + 1000, 600, False),  # 6,000/h
        (1000, 10, 600, False),  # driver reloaded: counter went down, no rate
        (None, 5000, 600, False),  # no previous reading
    ],
)
def test_corrected_ecc_is_judged_as_a_rate(prev, cur, dt_s, expect_rate_finding):
    previous = gpu(ecc_errors=ecc(cv=prev)) if prev is not None else None
    found = detect_gpu(gpu(ecc_errors=ecc(cv=cur)), previous, dt_s, T)
    assert any(f.code is C.GPU_ECC_CORRECTED_RATE for f in found) is expect_rate_finding


def test_rate_threshold_comes_from_config():
    strict = dataclasses.replace(T, ecc_corrected_rate_per_hour_max=100.0)
    found = detect_gpu(gpu(ecc_errors=ecc(cv=120)), gpu(ecc_errors=ecc(cv=100)), 600, strict)
    assert found[0].code is C.GPU_ECC_CORRECTED_RATE and found[0].evidence["rate_per_hour"] == 120.0


def ev(xid, bus="0000:07:00.0", source="kernel", t=0.0):
    return XidEvent(t, bus, xid, source, f"Xid {xid}")


XID_CASES = [
    ("XID 13 once is logged only", [ev(13)], (S.INFO, A.LOG_ONLY)),
    ("XID 13 three times escalates to investigation", [ev(13)] * 3, (S.WARNING, A.INVESTIGATE)),
    ("XID 31 is an application fault", [ev(31)] * 5, (S.INFO, A.LOG_ONLY)),
    ("XID 48 asks for a reset", [ev(48)], (S.CRITICAL, A.RESET_GPU)),
    ("XID 63 asks for a reset at the next drain", [ev(63)], (S.WARNING, A.RESET_GPU)),
    ("XID 64 recurring asks for a ticket", [ev(64)] * 3, (S.CRITICAL, A.TICKET)),
    ("XID 79 asks for a reboot", [ev(79)], (S.CRITICAL, A.REBOOT)),
    ("XID 92 is watched", [ev(92)], (S.WARNING, A.WATCH)),
    ("XID 109 once is watched", [ev(109)], (S.WARNING, A.WATCH)),
    ("XID 109 repeating asks for a reset", [ev(109)] * 3, (S.WARNING, A.RESET_GPU)),
    ("XID 119 asks for a reset", [ev(119)], (S.CRITICAL, A.RESET_GPU)),
    ("an unknown XID is investigated", [ev(4242)], (S.WARNING, A.INVESTIGATE)),
    (
        "the same XID from the kernel and NVML counts once",
        [ev(109), ev(109, source="nvml"), ev(109), ev(109, source="nvml")],
        (S.WARNING, A.WATCH),
    ),
]


@pytest.mark.parametrize("case, events, expected", XID_CASES, ids=[c[0] for c in XID_CASES])
def test_xid_rules(case, events, expected):
    (f,) = detect_xid(events, T)
    assert (f.severity, f.action) == expected
    assert f.code is C.GPU_XID and f.bus_id == "0000:07:00.0"


def test_xid_table_covers_the_reference_codes():
    assert set(XID_RULES) >= {13, 31, 43, 45, 48, 62, 63, 64, 68, 74, 79, 92, 94, 95, 109, 119, 120, 140, 154}


def test_xid_finding_names_the_gpu_when_the_bus_is_known():
    readout = GpuReadout(gpus=(gpu(index=3, uuid="GPU-3", bus_id="0000:4e:00.0"),), count=1)
    (f,) = detect_xid([ev(48, bus="0000:4e:00.0")], T, readout)
    assert f.device == "gpu3" and f.gpu_uuid == "GPU-3"
    (f,) = detect_xid([ev(48, bus="0000:99:00.0")], T, readout)
    assert f.device == "pci:0000:99:00.0"


def test_fallen_off_bus_message_without_xid_asks_for_reboot():
    (f,) = detect_xid([XidEvent(0, "0000:b7:00.0", None, "kernel", "fallen off the bus")], T)
    assert (f.code, f.action, f.severity) == (C.GPU_FELL_OFF_BUS, A.REBOOT, S.CRITICAL)


def port(state, name="mlx5_0"):
    return IbPortSample(name, 1, state, "LinkUp", "InfiniBand", 25e9, 0, 0, {})


def test_ib_port_not_active_is_a_finding():
    assert [f.device for f in detect_ib([port("ACTIVE"), port("DOWN", "mlx5_1"), port("INIT", "mlx5_2")])] == [
        "mlx5_1/1",
        "mlx5_2/1",
    ]


def test_nfs_hung_and_not_mounted():
    found = detect_nfs(
        [
            NfsMountSample("/a", True, True, 0.01),
            NfsMountSample("/b", True, False, None, "nfs4"),
            NfsMountSample("/c", False, False, None),
        ]
    )
    assert [(f.code, f.device) for f in found] == [(C.NFS_HUNG, "/b"), (C.NFS_NOT_MOUNTED, "/c")]


@pytest.mark.parametrize(
    "used_ratio, expected", [(0.5, None), (0.90, S.WARNING), (0.96, S.WARNING), (0.97, S.CRITICAL)]
)
def test_disk_nearly_full_thresholds(used_ratio, expected):
    size = 10**12
    used = int(size * used_ratio)
    host = HostSample({}, 2, 1, 1, None, None, None, (FilesystemSample("/", size, size - used, used),), {})
    found = detect_disk(host, T)
    assert (found[0].severity if found else None) == expected


def test_detect_orders_findings_most_severe_first_and_needs_two_readings_for_rates():
    readout = GpuReadout(gpus=(gpu(ecc_errors=ecc(cv=0)), gpu(index=1, uuid="GPU-1", ecc_errors=ecc(uv=1))), count=2)
    r = {"gpu": CollectorResult("gpu", CollectorStatus.OK, 0.0, sample=readout)}
    first = Collection(1000.0, r)
    readout2 = GpuReadout(gpus=(gpu(ecc_errors=ecc(cv=100_000)), readout.gpus[1]), count=2)
    second = Collection(1060.0, {"gpu": CollectorResult("gpu", CollectorStatus.OK, 0.0, sample=readout2)})
    assert [f.code for f in detect(first, None, T, 2)] == [C.GPU_ECC_UNCORRECTED]
    found = detect(second, first, T, 2)
    assert [f.code for f in found] == [C.GPU_ECC_UNCORRECTED, C.GPU_ECC_CORRECTED_RATE]
