"""The pure scheduler core: ``decide(snapshot, now) -> Decisions``.

No database, no Flask, no clock, no I/O: the job manager and ``dlts sim`` build a ``Snapshot``,
call ``decide`` and carry out the returned decisions. See docs/scheduling.md.
"""

from dlts.scheduler.core import decide
from dlts.scheduler.framework import DEFAULT_PROFILE, REGISTRY, Profile, Rejection, register
from dlts.scheduler.model import (
    CPU_SKU,
    Decisions,
    Job,
    JobType,
    Node,
    Placement,
    Policy,
    SkuShape,
    Snapshot,
    Start,
    Stop,
    StopReason,
    Vc,
    Wait,
    WaitReason,
)
from dlts.scheduler import plugins  # noqa: E402,F401  (registers the built-in plugins by name)

__all__ = [
    "CPU_SKU",
    "DEFAULT_PROFILE",
    "Decisions",
    "Job",
    "JobType",
    "Node",
    "Placement",
    "Policy",
    "Profile",
    "REGISTRY",
    "Rejection",
    "SkuShape",
    "Snapshot",
    "Start",
    "Stop",
    "StopReason",
    "Vc",
    "Wait",
    "WaitReason",
    "decide",
    "register",
]
