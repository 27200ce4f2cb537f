"""All models, imported here so that Alembic and ``create_all`` see every table."""

from dlts.models.access import AllowedIp, RegistryCredential, SshKey, StorageUsage
from dlts.models.accounting import UsageJobDay, UsageTotal, UtilisationPoint
from dlts.models.base import Base, iso, utcnow
from dlts.models.identity import (
    ApiToken,
    Group,
    GroupMember,
    PortalSession,
    RateCounter,
    Role,
    RoleBinding,
    User,
)
from dlts.models.insight import JobInsight
from dlts.models.job import (
    ACTIVE,
    TERMINAL,
    TRANSITIONS,
    EndpointKind,
    EndpointStatus,
    EndReason,
    EventKind,
    IdempotencyKey,
    Job,
    JobAttempt,
    JobEndpoint,
    JobEvent,
    JobFavourite,
    JobStatus,
    JobTag,
    JobTemplate,
    JobType,
)
from dlts.models.lease import ManagersLease
from dlts.models.node import Node, NodeEvent, NodeEventKind, NodeFinding, NodeOrder, NodeState
from dlts.models.notify import OutboxMessage, OutboxStatus
from dlts.models.repair import RepairControl, RepairCycle, RepairStep
from dlts.models.storage import StorageExpiryLog, StorageSnapshot
from dlts.models.vc import VcEvent, VirtualCluster

__all__ = [
    "ACTIVE",
    "TERMINAL",
    "TRANSITIONS",
    "AllowedIp",
    "ApiToken",
    "Base",
    "EndReason",
    "EndpointKind",
    "EndpointStatus",
    "EventKind",
    "Group",
    "GroupMember",
    "IdempotencyKey",
    "Job",
    "JobAttempt",
    "JobEndpoint",
    "JobEvent",
    "JobFavourite",
    "JobInsight",
    "JobStatus",
    "JobTag",
    "JobTemplate",
    "JobType",
    "ManagersLease",
    "Node",
    "NodeEvent",
    "NodeEventKind",
    "NodeFinding",
    "NodeOrder",
    "NodeState",
    "OutboxMessage",
    "OutboxStatus",
    "PortalSession",
    "RateCounter",
    "RegistryCredential",
    "RepairControl",
    "RepairCycle",
    "RepairStep",
    "Role",
    "RoleBinding",
    "SshKey",
    "StorageExpiryLog",
    "StorageSnapshot",
    "StorageUsage",
    "UsageJobDay",
    "UsageTotal",
    "User",
    "UtilisationPoint",
    "VcEvent",
    "VirtualCluster",
    "iso",
    "utcnow",
]
