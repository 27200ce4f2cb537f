"""A real OpenLDAP ``slapd`` (Debian's) for the directory sync's tests: started on loopback ports with a
slapd.conf written here (no systemd, no system configuration touched), a self-signed certificate made
with openssl for its ldaps:// and StartTLS, seeded and changed with ldapadd/ldapmodify/ldapdelete.

The suffix is dc=example,dc=org; people are under ou=people, groups (posixGroup, memberUid) under
ou=groups. DLTS binds as cn=dlts,ou=services (a plain entry, so the size limit applies to it: plain
searches stop at ``SIZE_LIMIT`` entries, only a paged search gets them all)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

SUFFIX = "dc=example,dc=org"
ROOT_DN = f"cn=admin,{SUFFIX}"
ROOT_PW = "root-secret"
BIND_DN = f"cn=dlts,ou=services,{SUFFIX}"
BIND_PW = "dlts-bind-secret"
SIZE_LIMIT = 5
SLAPD = Path("/usr/sbin/slapd")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Slapd:
    directory: Path
    port: int  # ldap:// (StartTLS offered)
    tls_port: int  # ldaps://
    ca_file: Path
    password_file: Path
    process: subprocess.Popen

    def _tool(self, tool: str, ldif: str, *extra: str) -> None:
        result = subprocess.run([tool, "-x", "-H", f"ldap://127.0.0.1:{self.port}", "-D", ROOT_DN, "-w", ROOT_PW, *extra],
                                input=ldif, capture_output=True, text=True, timeout=60, check=False)
        assert result.returncode == 0, f"{tool}: {result.stderr}"

    def add(self, ldif: str) -> None:
        self._tool("ldapadd", ldif)

    def modify(self, ldif: str) -> None:
        self._tool("ldapmodify", ldif)

    def delete(self, *dns: str) -> None:
        self._tool("ldapdelete", "\n".join(dns) + "\n")

    def add_user(self, name: str, uid: int | None, gid: int | None = None, mail: str | None = None) -> None:
        lines = [f"dn: uid={name},ou=people,{SUFFIX}", "objectClass: inetOrgPerson", "objectClass: posixAccount",
                 f"uid: {name}", f"cn: {name}", f"sn: {name}", f"homeDirectory: /home/{name}",
                 f"uidNumber: {uid if uid is not None else 0}", f"gidNumber: {gid if gid is not None else uid or 0}"]
        if mail:
            lines.append(f"mail: {mail}")
        self.add("\n".join(lines) + "\n")

    def add_group(self, name: str, gid: int, members: list[str]) -> None:
        lines = [f"dn: cn={name},ou=groups,{SUFFIX}", "objectClass: posixGroup", f"cn: {name}", f"gidNumber: {gid}"]
        lines += [f"memberUid: {m}" for m in members]
        self.add("\n".join(lines) + "\n")

    def delete_user(self, name: str) -> None:
        self.delete(f"uid={name},ou=people,{SUFFIX}")

    def settings(self, **overrides) -> dict:
        """The directory: section of dlts.yaml for this server (ldaps:// by default)."""
        return {"url": f"ldaps://127.0.0.1:{self.tls_port}", "ca_file": str(self.ca_file), "bind_dn": BIND_DN,
                "bind_password_file": str(self.password_file), "user_base": f"ou=people,{SUFFIX}",
                "group_base": f"ou=groups,{SUFFIX}", "page_size": 2, **overrides}


CONF = """\
include /etc/ldap/schema/core.schema
include /etc/ldap/schema/cosine.schema
include /etc/ldap/schema/nis.schema
include /etc/ldap/schema/inetorgperson.schema
modulepath /usr/lib/ldap
moduleload back_mdb
pidfile {dir}/slapd.pid
argsfile {dir}/slapd.args
TLSCACertificateFile {dir}/cert.pem
TLSCertificateFile {dir}/cert.pem
TLSCertificateKeyFile {dir}/key.pem
database mdb
maxsize 104857600
suffix "{suffix}"
rootdn "{root_dn}"
rootpw {root_pw}
directory {dir}/db
sizelimit size.soft={limit} size.hard={limit} size.prtotal=unlimited
access to attrs=userPassword by anonymous auth by self read by * none
access to * by * read
"""


def start(directory: Path) -> Slapd:
    if not SLAPD.exists() or shutil.which("ldapadd") is None:
        pytest.skip("slapd and ldap-utils are not installed (apt-get install slapd ldap-utils; .ci/dev does)")
    (directory / "db").mkdir(parents=True)
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost", "-keyout", str(directory / "key.pem"),
                    "-out", str(directory / "cert.pem")], check=True, capture_output=True, timeout=60)
    conf = directory / "slapd.conf"
    conf.write_text(CONF.format(dir=directory, suffix=SUFFIX, root_dn=ROOT_DN, root_pw=ROOT_PW, limit=SIZE_LIMIT))
    port, tls_port = _free_port(), _free_port()
    # -d 0: stay in the foreground (no daemon to chase), log nothing extra
    with open(directory / "slapd.log", "w") as log:  # the child keeps its own descriptor
        process = subprocess.Popen([str(SLAPD), "-f", str(conf), "-h",
                                    f"ldap://127.0.0.1:{port}/ ldaps://127.0.0.1:{tls_port}/", "-d", "0"],
                                   stdout=log, stderr=subprocess.STDOUT)
    password_file = directory / "bind-password"
    password_file.write_text(BIND_PW + "\n")
    server = Slapd(directory, port, tls_port, directory / "cert.pem", password_file, process)
    deadline = time.monotonic() + 60
    while True:
        probe = subprocess.run(["ldapsearch", "-x", "-H", f"ldap://127.0.0.1:{port}", "-D", ROOT_DN, "-w", ROOT_PW,
                                "-b", "", "-s", "base"], capture_output=True, timeout=30, check=False)
        if probe.returncode in (0, 32):
            break
        if process.poll() is not None or time.monotonic() > deadline:
            stop(server)
            raise AssertionError(f"slapd did not start: {(directory / 'slapd.log').read_text()[-2000:]}")
        time.sleep(0.2)
    server.add(f"""dn: {SUFFIX}
objectClass: dcObject
objectClass: organization
dc: example
o: Example

dn: ou=people,{SUFFIX}
objectClass: organizationalUnit
ou: people

dn: ou=groups,{SUFFIX}
objectClass: organizationalUnit
ou: groups

dn: ou=services,{SUFFIX}
objectClass: organizationalUnit
ou: services

dn: {BIND_DN}
objectClass: organizationalRole
objectClass: simpleSecurityObject
cn: dlts
userPassword: {BIND_PW}
""")
    return server


def stop(server: Slapd) -> None:
    server.process.terminate()
    try:
        server.process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait(timeout=30)


@pytest.fixture
def slapd(tmp_path):
    server = start(tmp_path / "slapd")
    yield server
    stop(server)
