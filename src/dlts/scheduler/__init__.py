"""The pure scheduler core: ``decide(snapshot, now) -> Decisions``.

No database, no Flask, no clock, no I/O: the job manager and ``dlts sim`` build a ``Snapshot``,
call ``decide`` and carry out the returned decisions. See docs/scheduling.md.
"""

from dlts.scheduler.core import decide
from dlts.scheduler.model import (
    CPU_SKU,
    Decisions,
    Job,
    JobType,
    Node,
    Placement,
    Policy,
    Rejection,
    SkuShape,
    Snapshot,
    Start,
    Stop,
    StopReason,
    Vc,
    Wait,
    WaitReason,
)
from dlts.scheduler.plugins.registry import BUILTIN, DEFAULT_PROFILE, PROFILES, Profile, Registry, profile_named

__all__ = [
    "BUILTIN",
    "CPU_SKU",
    "DEFAULT_PROFILE",
    "PROFILES",
    "Decisions",
    "Job",
    "JobType",
    "Node",
    "Placement",
    "Policy",
    "Profile",
    "Registry",
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
    "profile_named",
]
