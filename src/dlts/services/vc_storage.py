"""A VC's storage document (``VirtualCluster.storage``): its schema, and the mounts a job gets from it.

The document, written whole by cluster admins (``dlts vc storage VC --json``, ``PUT
/api/v1/vcs/{name}/storage``, the inventory's ``dlts_vcs``)::

    {"nfs":  [{"name"?, "server", "path", "mount_path", "read_only"?}],
     "host": [{"name"?, "path", "mount_path", "read_only"?}],
     "home": {"kind": "nfs" | "host", "server"?, "path", "mount_path"},
     "lustre": {...}}

``nfs`` entries are NFS exports the kubelet mounts; ``host`` entries are directories that exist on
every node (a Lustre or NFS client mount the operator made); ``home`` is the parent of the users'
home directories: a job of user U gets ``<path>/U`` at ``<mount_path>/U``. ``lustre`` is the storage
manager's (docs/lustre.md) and is checked by ``dlts_lustre``'s own policy.

``normalize`` checks a document and returns it in its stored form (every entry named, ``read_only``
explicit); ``mounts_for`` turns a stored document into the ``StorageMount``s of one user's job.
"""

from __future__ import annotations

import ipaddress
import posixpath
import re
from collections.abc import Mapping
from typing import Any

from dlts.backends.base import StorageMount
from dlts.errors import InvalidInput

KEYS = ("nfs", "host", "home", "lustre")
MAX_ENTRIES = 32
MAX_PATH = 1024
LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$")  # a DNS label short enough for the "vc-" prefix
HOSTNAME = re.compile(r"^(?=.{1,253}$)([A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?)(\.[A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?)*$")
# where nothing may be mounted: the root, the kernel's trees, and DLTS's own directories in the pod
FORBIDDEN_MOUNTS = ("/", "/proc", "/sys", "/dev", "/etc", "/bin", "/sbin", "/lib", "/lib64", "/usr", "/var/run", "/run")
RESERVED_MOUNT_PREFIX = "/dlts"
ENTRY_KEYS = {"nfs": {"name", "server", "path", "mount_path", "read_only"},
              "host": {"name", "path", "mount_path", "read_only"}}
HOME_KEYS = {"kind", "server", "path", "mount_path"}


def _bad(field: str, message: str) -> InvalidInput:
    return InvalidInput(f"storage.{field}: {message}", code="invalid_storage", details={"field": f"storage.{field}"})


def _path(field: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise _bad(field, "must be an absolute path like /export/data.")
    if len(value) > MAX_PATH or not value.isprintable():
        raise _bad(field, f"must be printable text of at most {MAX_PATH} characters.")
    if not value.startswith("/"):
        raise _bad(field, f"{value[:80]!r} must be an absolute path (start with /).")
    parts = value.split("/")[1:]
    if ".." in parts or "." in parts:
        raise _bad(field, f"{value[:80]!r} must not contain '.' or '..' components.")
    if value != "/" and (value.endswith("/") or "//" in value):
        raise _bad(field, f"{value[:80]!r} must be written without empty components or a trailing /.")
    return value


def _mount_path(field: str, value: Any) -> str:
    path = _path(field, value)
    for forbidden in FORBIDDEN_MOUNTS:
        if path == forbidden or (forbidden != "/" and path.startswith(forbidden + "/")):
            raise _bad(field, f"{path[:80]!r} would hide the image's {forbidden}; mount somewhere like /data or /mnt/NAME.")
    if path.startswith(RESERVED_MOUNT_PREFIX):
        raise _bad(field, f"{path[:80]!r}: paths starting with {RESERVED_MOUNT_PREFIX} are DLTS's own in every pod.")
    return path


def _server(field: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise _bad(field, "an NFS entry needs the server's host name or IP address.")
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        pass
    if not HOSTNAME.match(value):
        raise _bad(field, f"{value[:80]!r} is not a host name or IP address.")
    return value.lower()


def _read_only(field: str, value: Any) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        raise _bad(field, "must be true or false.")
    return value


def _entries(kind: str, value: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        raise _bad(kind, f"must be a list of {kind} entries.")
    if len(value) > MAX_ENTRIES:
        raise _bad(kind, f"at most {MAX_ENTRIES} entries.")
    out = []
    for i, entry in enumerate(value):
        where = f"{kind}[{i}]"
        if not isinstance(entry, Mapping):
            raise _bad(where, "must be an object.")
        unknown = sorted(set(entry) - ENTRY_KEYS[kind])
        if unknown:
            raise _bad(f"{where}.{str(unknown[0])[:40]}", f"unknown key; a {kind} entry has {', '.join(sorted(ENTRY_KEYS[kind]))}.")
        name = entry.get("name")
        if name is None:
            name = f"{kind}-{i}"
        elif not isinstance(name, str) or not LABEL.match(name):
            raise _bad(f"{where}.name", "must be a DNS label: lowercase letters, digits and '-', at most 40, "
                                        "starting and ending with a letter or digit.")
        normalized: dict[str, Any] = {"name": name}
        if kind == "nfs":
            normalized["server"] = _server(f"{where}.server", entry.get("server"))
        normalized["path"] = _path(f"{where}.path", entry.get("path"))
        normalized["mount_path"] = _mount_path(f"{where}.mount_path", entry.get("mount_path"))
        normalized["read_only"] = _read_only(f"{where}.read_only", entry.get("read_only"))
        out.append(normalized)
    return out


def _home(value: Any) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise _bad("home", "must be an object with kind, path and mount_path (and server for nfs).")
    unknown = sorted(set(value) - HOME_KEYS)
    if unknown:
        raise _bad(f"home.{str(unknown[0])[:40]}", f"unknown key; home has {', '.join(sorted(HOME_KEYS))}.")
    kind = value.get("kind")
    if kind not in ("nfs", "host"):
        raise _bad("home.kind", "must be nfs (an export the kubelet mounts) or host (a directory on every node).")
    home: dict[str, Any] = {"kind": kind}
    if kind == "nfs":
        home["server"] = _server("home.server", value.get("server"))
    elif value.get("server") is not None:
        raise _bad("home.server", "only a home of kind nfs has a server.")
    home["path"] = _path("home.path", value.get("path"))
    home["mount_path"] = _mount_path("home.mount_path", value.get("mount_path"))
    return home


def check_lustre(vc_name: str, value: Any) -> dict[str, Any]:
    from dlts_lustre.errors import PolicyError
    from dlts_lustre.policy import policy_from_vcs

    if not isinstance(value, Mapping):
        raise _bad("lustre", "must be an object (docs/lustre.md).")
    if "name" in value:  # the VC's name is the entry's name; another one would apply this to that VC
        raise _bad("lustre.name", "is the VC's own name; leave it out.")
    lustre = {k: v for k, v in value.items() if v is not None}
    try:  # the VC's entry alone; filesystem-wide checks happen when the storage manager applies it
        policy_from_vcs([{"name": vc_name, **lustre}], {"filesystem": {"name": "check", "mount": "/check"}})
    except PolicyError as exc:
        raise InvalidInput(str(exc), code="invalid_lustre_settings", details={"field": "storage.lustre"}) from None
    return lustre


def normalize(vc_name: str, document: Any) -> dict[str, Any]:
    """The stored form of ``document``, or ``InvalidInput`` naming the field at fault."""
    if not isinstance(document, Mapping):
        raise InvalidInput("storage must be an object with nfs, host, home and/or lustre.", code="invalid_storage",
                           details={"field": "storage"})
    unknown = sorted(str(k) for k in set(document) - set(KEYS))
    if unknown:
        raise _bad(unknown[0][:40], f"unknown key; storage has {', '.join(KEYS)}.")
    stored: dict[str, Any] = {}
    for kind in ("nfs", "host"):
        if document.get(kind):
            stored[kind] = _entries(kind, document[kind])
    if document.get("home") is not None:
        stored["home"] = _home(document["home"])
    if document.get("lustre"):
        stored["lustre"] = check_lustre(vc_name, document["lustre"])
    names: dict[str, str] = {}
    mounts: dict[str, str] = {}
    for kind in ("nfs", "host"):
        for i, entry in enumerate(stored.get(kind, [])):
            where = f"{kind}[{i}]"
            if entry["name"] in names:
                raise _bad(f"{where}.name", f"{entry['name']!r} is also the name of {names[entry['name']]}; "
                                            "give every entry its own name.")
            names[entry["name"]] = where
            if entry["mount_path"] in mounts:
                raise _bad(f"{where}.mount_path", f"{entry['mount_path']!r} is also the mount_path of "
                                                  f"{mounts[entry['mount_path']]}.")
            mounts[entry["mount_path"]] = where
    if "home" in stored:
        home_mount = stored["home"]["mount_path"]
        for mount, where in mounts.items():
            if mount == home_mount or mount.startswith(home_mount + "/"):
                raise _bad("home.mount_path", f"{home_mount!r} would hold the users' homes, but {where} is mounted "
                                              f"at {mount!r}; mount it elsewhere.")
    return stored


def mounts_for(storage: Mapping[str, Any] | None, user: str) -> tuple[StorageMount, ...]:
    """The mounts of a job of ``user`` in a VC with this stored document: its NFS exports, its host
    directories, then the user's home. Volume names are ``vc-<name>`` and ``home``: unique within the
    job and apart from the backends' own (``dlts-*``, ``host-<i>``)."""
    storage = storage or {}
    mounts = [StorageMount(name=f"vc-{e['name']}", kind="nfs", path=e["path"], mount_path=e["mount_path"],
                           server=e["server"], read_only=bool(e.get("read_only")))
              for e in storage.get("nfs", ())]
    mounts += [StorageMount(name=f"vc-{e['name']}", kind="host", path=e["path"], mount_path=e["mount_path"],
                            read_only=bool(e.get("read_only")))
               for e in storage.get("host", ())]
    home = storage.get("home")
    if home:
        mounts.append(StorageMount(name="home", kind=home["kind"], path=posixpath.join(home["path"], user),
                                   mount_path=posixpath.join(home["mount_path"], user), server=home.get("server", "")))
    return tuple(mounts)
