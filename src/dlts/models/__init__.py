"""All models, imported here so that Alembic and ``create_all`` see every table."""

from dlts.models.access import AllowedIp, RegistryCredential, SshKey, StorageUsage
from dlts.models.base import Base, iso, utcnow
from dlts.models.identity import ApiToken, Group, GroupMember, Role, RoleBinding, User
from dlts.models.job import (
    ACTIVE,
    TERMINAL,
    TRANSITIONS,
    EndpointKind,
    EndpointStatus,
    Job,
    JobAttempt,
    JobEndpoint,
    JobEvent,
    JobStatus,
    JobTemplate,
)
from dlts.models.node import Node, NodeEvent, NodeFinding, NodeOrder, NodeState
from dlts.models.notify import OutboxMessage, OutboxStatus
from dlts.models.repair import RepairControl, RepairCycle, RepairStep
from dlts.models.storage import StorageExpiryLog, StorageSnapshot
from dlts.models.vc import VcEvent, VirtualCluster

__all__ = [
    "ACTIVE", "TERMINAL", "TRANSITIONS", "AllowedIp", "ApiToken", "Base", "EndpointKind", "EndpointStatus", "Group",
    "GroupMember", "Job", "JobAttempt", "JobEndpoint", "JobEvent", "JobStatus", "JobTemplate", "Node", "NodeEvent", "NodeFinding",
    "NodeOrder", "NodeState", "OutboxMessage", "OutboxStatus", "RegistryCredential", "RepairControl", "RepairCycle",
    "RepairStep", "Role", "RoleBinding", "SshKey", "StorageExpiryLog", "StorageSnapshot", "StorageUsage", "User", "VcEvent", "VirtualCluster", "iso", "utcnow",
]
