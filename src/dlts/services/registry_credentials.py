"""Private image registry credentials of a user (``/me/registry-credentials``) or of a VC
(``/vcs/{name}/registry-credentials``, VC admins and cluster admins).

Passwords are encrypted with Fernet (AES-128-CBC + HMAC-SHA256) under a key derived from the
configured ``secret_key`` by HKDF-SHA256, so a copy of the database alone does not reveal them. They
are never returned by any read: the job manager decrypts them only to hand them to the cluster as a
job's image pull secret (``for_launch``). Changing ``secret_key`` makes the stored passwords
unreadable: the job manager then skips them (and logs which) and their owners add them again.
"""

from __future__ import annotations

import base64
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from cryptography.fernet import Fernet, InvalidToken
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from sqlalchemy.orm import Session

from dlts.backends.base import RegistryCredential as LaunchCredential
from dlts.errors import Forbidden, InvalidInput, NotFound, Refused, WrongState
from dlts.models import RegistryCredential, User, VirtualCluster, iso
from dlts.repositories import limits as limits_repo
from dlts.services import policy
from dlts.services.auth import Principal
from dlts.services.transaction import transactional

log = logging.getLogger(__name__)

MAX_PER_OWNER = 20
MAX_PASSWORD_CHARS = 4096
HKDF_INFO = b"dlts registry credentials v1"
# a registry host (name or IPv4, optional port), optionally with a path (e.g. index.docker.io/v1/)
SERVER = re.compile(r"^(https://)?[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(\.[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)*"
                    r"(:[0-9]{1,5})?(/[A-Za-z0-9._-]+)*/?$")
# the same, before lowercasing, for the OpenAPI document
SERVER_PATTERN = (SERVER.pattern.replace("[a-z0-9]", "[A-Za-z0-9]").replace("[-a-z0-9]", "[-A-Za-z0-9]")
                  .replace("(https://)", "([Hh][Tt][Tt][Pp][Ss]://)"))


@dataclass(frozen=True)
class CredentialView:
    """What any read shows: never the password."""

    id: int
    scope: str  # user | vc
    owner: str  # the user's or the VC's name
    server: str
    username: str
    created_by: str
    created_at: str | None


def fernet(secret_key: str) -> Fernet:
    if not secret_key:
        raise Refused("This server has no secret_key, so it cannot store registry passwords encrypted; "
                      "an operator must set secret_key in dlts.yaml (or DLTS_SECRET_KEY).", code="secret_key_missing")
    key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=HKDF_INFO).derive(secret_key.encode())
    return Fernet(base64.urlsafe_b64encode(key))


def _check(server: str, username: str, password: str) -> str:
    if not isinstance(server, str) or len(server) > 255 or not SERVER.match(server.lower()) or \
            {".", ".."} & set(server.split("://")[-1].split("/")[1:]):
        raise InvalidInput("server must be a registry host like ghcr.io or registry.example.com:5000.",
                           details={"field": "server"})
    if not isinstance(username, str) or not 1 <= len(username) <= 255 or not username.isprintable() or ":" in username:
        raise InvalidInput("username must be printable text of 1-255 characters without ':'.", details={"field": "username"})
    if not isinstance(password, str) or not 1 <= len(password) <= MAX_PASSWORD_CHARS or not password.isprintable():
        raise InvalidInput(f"password must be printable text of 1-{MAX_PASSWORD_CHARS} characters (a token works too).",
                           details={"field": "password"})
    return server.lower()


def _view(row: RegistryCredential, owner: str) -> CredentialView:
    return CredentialView(row.id, row.scope, owner, row.server, row.username, row.created_by, iso(row.created_at))


def _add(session: Session, secret_key: str, principal: Principal, owner: str, where: tuple[sa.ColumnElement[bool], ...],
         values: dict[str, Any], server: str, username: str, password: str,
         on_add: Callable[[RegistryCredential], None] | None = None) -> CredentialView:
    server = _check(server, username, password)
    rows = list(session.scalars(sa.select(RegistryCredential).where(*where)))
    if any(r.server == server for r in rows):
        raise WrongState(f"There is already a credential for {server} here; delete it first to replace it.",
                         code="duplicate_registry_credential", details={"field": "server"})
    if len(rows) >= MAX_PER_OWNER:
        raise Refused(f"At most {MAX_PER_OWNER} registry credentials each; delete one first.",
                      code="too_many_registry_credentials", details={"max": MAX_PER_OWNER})
    row = RegistryCredential(server=server, username=username, created_by=principal.name,
                             password_encrypted=fernet(secret_key).encrypt(password.encode()).decode(), **values)
    session.add(row)
    if on_add is not None:
        on_add(row)
    session.flush()  # its id and created_at; the use-case's transaction commits
    return _view(row, owner)


# -- the caller's own ---------------------------------------------------------------------------------

def list_mine(session: Session, principal: Principal) -> list[CredentialView]:
    rows = session.scalars(sa.select(RegistryCredential).where(
        RegistryCredential.scope == "user", RegistryCredential.user_id == principal.user_id).order_by(RegistryCredential.id))
    return [_view(r, principal.name) for r in rows]


@transactional
def add_mine(session: Session, secret_key: str, principal: Principal, server: str, username: str,
             password: str) -> CredentialView:
    where = (RegistryCredential.scope == "user", RegistryCredential.user_id == principal.user_id)
    # the cap is counted under the owner's row lock: parallel adds count one after the other
    limits_repo.lock(session, User.id, principal.user_id, touch=User.created_at)
    return _add(session, secret_key, principal, principal.name, where, {"scope": "user", "user_id": principal.user_id},
                server, username, password)


@transactional
def delete_mine(session: Session, principal: Principal, credential_id: int) -> None:
    row = session.get(RegistryCredential, credential_id)
    if row is None or row.scope != "user" or row.user_id != principal.user_id:
        raise NotFound(f"You have no registry credential with id {credential_id}.", code="registry_credential_not_found")
    session.delete(row)


# -- a VC's ---------------------------------------------------------------------------------------------

def _vc_for_admin(session: Session, principal: Principal, vc_name: str, action: str) -> VirtualCluster:
    policy.require_vc_visible(principal, vc_name)
    vc = session.scalar(sa.select(VirtualCluster).where(VirtualCluster.name == vc_name))
    if vc is None:
        raise NotFound(f"VC {vc_name[:64]!r} does not exist.", code="vc_not_found")
    if not principal.is_vc_admin(vc_name):
        raise Forbidden(f"Only an admin of VC {vc_name} (or a cluster admin) may {action} its registry credentials.",
                        code="requires_vc_admin")
    return vc


def list_vc(session: Session, principal: Principal, vc_name: str) -> list[CredentialView]:
    vc = _vc_for_admin(session, principal, vc_name, "see")
    rows = session.scalars(sa.select(RegistryCredential).where(
        RegistryCredential.scope == "vc", RegistryCredential.vc_id == vc.id).order_by(RegistryCredential.id))
    return [_view(r, vc.name) for r in rows]


@transactional
def add_vc(session: Session, secret_key: str, principal: Principal, vc_name: str, server: str, username: str,
           password: str) -> CredentialView:
    from dlts.repositories import vc_events

    vc = _vc_for_admin(session, principal, vc_name, "add")
    where = (RegistryCredential.scope == "vc", RegistryCredential.vc_id == vc.id)
    limits_repo.lock(session, VirtualCluster.id, vc.id, touch=VirtualCluster.created_at)
    return _add(session, secret_key, principal, vc.name, where, {"scope": "vc", "vc_id": vc.id}, server, username, password,
                on_add=lambda row: vc_events.record(session, vc.name, principal.name, "registry_credential", None,
                                                    {"server": row.server, "username": row.username}))


@transactional
def delete_vc(session: Session, principal: Principal, vc_name: str, credential_id: int) -> None:
    from dlts.repositories import vc_events

    vc = _vc_for_admin(session, principal, vc_name, "delete")
    row = session.get(RegistryCredential, credential_id)
    if row is None or row.scope != "vc" or row.vc_id != vc.id:
        raise NotFound(f"VC {vc.name} has no registry credential with id {credential_id}.",
                       code="registry_credential_not_found")
    vc_events.record(session, vc.name, principal.name, "registry_credential",
                     {"server": row.server, "username": row.username}, None)
    session.delete(row)


# -- the job manager's ------------------------------------------------------------------------------------

def for_launch(session: Session, secret_key: str, user_id: int, vc_id: int) -> tuple[LaunchCredential, ...]:
    """The decrypted credentials a job of this user in this VC pulls its image with: the user's
    first, then the VC's (one query). A password that does not decrypt (``secret_key`` changed) is
    left out and logged; the job then fails to pull and shows why."""
    rows = list(session.scalars(sa.select(RegistryCredential).where(sa.or_(
        sa.and_(RegistryCredential.scope == "user", RegistryCredential.user_id == user_id),
        sa.and_(RegistryCredential.scope == "vc", RegistryCredential.vc_id == vc_id)))
        .order_by(sa.case((RegistryCredential.scope == "user", 0), else_=1), RegistryCredential.id)))
    if not rows:
        return ()
    try:
        box = fernet(secret_key)
    except Refused:
        log.warning("registry credentials %s not used: secret_key is not set", [r.id for r in rows])
        return ()
    out = []
    for row in rows:
        try:
            password = box.decrypt(row.password_encrypted.encode()).decode()
        except InvalidToken:
            log.warning("registry credential %s (%s, %s) does not decrypt with this secret_key; its owner must add it "
                        "again", row.id, row.scope, row.server)
            continue
        out.append(LaunchCredential(server=row.server, username=row.username, password=password))
    return tuple(out)
