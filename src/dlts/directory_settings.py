"""The ``directory:`` section of dlts.yaml: where ``dlts directory sync`` reads users and groups (LDAP)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

NAME_PATTERN = r"^[a-z][a-z0-9_.-]{0,63}$"


class VcRoleMapping(BaseModel):
    """Every user of directory group ``group`` is a ``role`` of VC ``vc`` while they are in it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    group: str = Field(pattern=NAME_PATTERN)
    vc: str = Field(pattern=NAME_PATTERN)
    role: Literal["member", "admin"] = "member"


class DirectorySettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # ldaps://ldap.example.org (TLS from the start, port 636) or ldap://ldap.example.org with start_tls;
    # "": no directory (`dlts managers` runs no sync)
    url: str = ""
    # upgrade an ldap:// connection to TLS before binding (refused with ldaps://)
    start_tls: bool = False
    # CA bundle the server's certificate is verified against; None: the system's CAs
    ca_file: Path | None = None
    # plain ldap:// without start_tls sends the bind password in the clear: refused unless this is true
    allow_plaintext: bool = False
    # the service account; None: an anonymous bind
    bind_dn: str | None = Field(None, max_length=1024)
    # a file holding the bind password (one line; read at each sync)
    bind_password_file: Path | None = None
    user_base: str = Field("", max_length=1024)
    user_filter: str = Field("(objectClass=posixAccount)", max_length=1024)
    user_name_attribute: str = "uid"
    uid_attribute: str = "uidNumber"
    gid_attribute: str = "gidNumber"
    email_attribute: str = "mail"
    group_base: str = Field("", max_length=1024)
    group_filter: str = Field("(objectClass=posixGroup)", max_length=1024)
    group_name_attribute: str = "cn"
    # memberUid (user names) or member/uniqueMember (DNs of user entries)
    group_member_attribute: str = "memberUid"
    # entries per page of the paged search (RFC 2696)
    page_size: int = Field(500, ge=1, le=10_000)
    timeout_s: float = Field(30.0, gt=0, le=600)
    # how often `dlts managers` syncs
    interval_s: float = Field(3600.0, ge=60, le=7 * 86400)
    # a sync that would disable more than this share of the users it manages stops, writes nothing and
    # reports (a directory outage or a wrong filter must not lock everybody out)
    max_disable_percent: float = Field(10.0, ge=0, le=100)
    # which users missing from the directory are disabled: those the sync made or adopted
    # (directory_users), or every user except keep_users (all_users)
    disable_missing: Literal["directory_users", "all_users"] = "directory_users"
    # never disabled by the sync (local break-glass admins)
    keep_users: tuple[str, ...] = ()
    # group -> VC role mappings; bindings the sync made that are no longer listed are removed
    vc_roles: tuple[VcRoleMapping, ...] = ()

    @property
    def enabled(self) -> bool:
        return bool(self.url)

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        if value and (urlsplit(value).scheme not in ("ldap", "ldaps") or not urlsplit(value).hostname):
            raise ValueError("must look like ldaps://ldap.example.org or ldap://ldap.example.org:389")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> DirectorySettings:
        if not self.url:
            return self
        scheme = urlsplit(self.url).scheme
        if scheme == "ldaps" and self.start_tls:
            raise ValueError("start_tls is for ldap:// URLs; ldaps:// is TLS already")
        if scheme == "ldap" and not self.start_tls and self.bind_dn and not self.allow_plaintext:
            raise ValueError("ldap:// without start_tls sends the bind password in the clear; set start_tls: true, "
                             "use ldaps://, or set allow_plaintext: true")
        if self.bind_dn and self.bind_password_file is None:
            raise ValueError("bind_dn needs bind_password_file (a file holding the password)")
        if not self.user_base:
            raise ValueError("user_base is required with url (e.g. ou=people,dc=example,dc=org)")
        return self
