"""Disposable Debian systems for the converge test: image cache, boot, SSH.

This module owns the throwaway machine that the Ansible converge test deploys into: a real
Debian 12 root file system with systemd as PID 1, reached over SSH. The CI hosts have no systemd
of their own and no container engine, so the module boots that system itself, one of two ways:

* ``DebianVM`` boots it under qemu (KVM where it can run a stock kernel, else TCG emulation, which
  costs about 45 minutes per converge) behind a qcow2 overlay, reached on loopback port forwards.
* ``DebianContainer`` boots the same image with ``systemd-nspawn -b`` (same kernel as the host, so
  seconds instead of minutes): the image is mounted read-only under an overlay whose upper
  directory is the container's writable layer, the container gets its own network namespace joined
  to the host by a veth pair on a private /24 (NAT to the outside, as qemu's user network gives the
  VM), and it is reached over SSH at its own address.

``boot_target()`` picks one: the VM where KVM is usable (or with ``DLTS_CI_TARGET=vm``), else the
container (``DLTS_CI_TARGET=container`` forces it).

``build_image()`` debootstraps a root file system once, packs it into a raw ext4 image with
``mkfs.ext4 -d`` (no loop devices needed) and keeps it under ``/var/cache/dlts-ci/`` keyed by a
hash of everything that shapes it, so reruns reuse it.

Run ``python tests/ansible/dlts_vm.py build`` to warm the cache by hand, and
``python tests/ansible/dlts_vm.py boot [container|vm]`` to boot a target and get an SSH command.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import itertools
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Self

CACHE_ROOT = Path(os.environ.get("DLTS_CI_CACHE", "/var/cache/dlts-ci"))
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
IMAGE_SIZE = "6G"


def _accelerator() -> str:
    """KVM when it can boot a stock Debian kernel, else TCG (full emulation, slower but faithful).

    Some hosts expose /dev/kvm through PVM (kvm_pvm), a paravirtual hypervisor for nested setups
    that only boots guest kernels built for it: a stock kernel hangs silently right after the
    decompressor. Such hosts get TCG.
    """
    forced = os.environ.get("DLTS_CI_QEMU_ACCEL")
    if forced:
        return forced
    if not os.access("/dev/kvm", os.R_OK | os.W_OK) or Path("/sys/module/kvm_pvm").exists():
        return "tcg,thread=multi"
    return "kvm"


ACCEL = _accelerator()

# Packages baked into the image. The first block makes a bootable, SSH-reachable systemd machine;
# the second block is what the mariadb, dlts_control, dlts_agent, monitoring and nfs_server (its
# NFS-Ganesha variant) roles install (Prometheus and Alertmanager; Grafana is not in Debian and the
# converge skips it), pre-seeded so that the converge does not spend CI minutes downloading them
# (the roles still assert them with ansible.builtin.apt, which then reports "ok").
BASE_PACKAGES = (
    "linux-image-cloud-amd64",
    "initramfs-tools",
    "systemd-sysv",
    "systemd-resolved",
    "udev",
    "dbus",
    "openssh-server",
    "python3",
    "python3-apt",
    "sudo",
    "iproute2",
    "ca-certificates",
    "curl",
)
ROLE_PACKAGES = (
    "mariadb-server",
    "mariadb-client",
    "mariadb-backup",
    "python3-pymysql",
    "python3-venv",
    "python3-pip",
    "nginx",
    "ssl-cert",
    "openssl",
    "chrony",
    "rsync",
    "pciutils",
    "nftables",
    "prometheus",
    "prometheus-alertmanager",
    "nfs-ganesha",
    "nfs-ganesha-vfs",
)

# Files written into the root file system after debootstrap. Keep in this table: the hash below
# covers it, so editing a file rebuilds the image.
ROOTFS_FILES: dict[str, str] = {
    "etc/hostname": "dlts-vm\n",
    "etc/hosts": "127.0.0.1 localhost\n127.0.1.1 dlts-vm\n",
    "etc/fstab": "LABEL=dltsroot / ext4 defaults,discard 0 1\n",
    "etc/systemd/network/10-wired.network": "[Match]\nName=en* eth*\n\n[Network]\nDHCP=ipv4\n",
    # Login needs no password on the serial console; SSH accepts the generated key only.
    "etc/ssh/sshd_config.d/10-dlts-ci.conf": (
        "PermitRootLogin prohibit-password\nPasswordAuthentication no\nUseDNS no\n"
    ),
    # apt-daily and man-db timers would compete with the converge for the dpkg lock.
    "etc/apt/apt.conf.d/99-dlts-ci": 'APT::Periodic::Enable "0";\n',
    # The cloud kernel builds most of these in; listing them keeps the initrd bootable either way.
    "etc/initramfs-tools/modules": "virtio_pci\nvirtio_blk\nvirtio_net\next4\n",
}
CHROOT_SCRIPT = """
set -eu
export DEBIAN_FRONTEND=noninteractive
systemctl enable systemd-networkd systemd-resolved ssh
systemctl mask apt-daily.timer apt-daily-upgrade.timer man-db.timer e2scrub_all.timer fstrim.timer
systemctl disable mariadb nginx chrony prometheus prometheus-alertmanager nfs-ganesha || true
# nfs-common (NFS-Ganesha's dependency) starts the kernel's NFS client helpers; nothing here mounts
# NFS, and rpc_pipefs (the kernel's, for gssd and idmapd) cannot be mounted in a container.
systemctl disable nfs-client.target || true
systemctl mask run-rpc_pipefs.mount
ln -sf /run/systemd/resolve/stub-resolv.conf /etc/resolv.conf
passwd -d root
update-initramfs -u -k all
apt-get clean
"""


@dataclasses.dataclass(frozen=True)
class Image:
    """A cached bootable image: root file system, kernel, initrd and the SSH key that opens it."""

    root: Path

    @property
    def disk(self) -> Path:
        return self.root / "rootfs.raw"

    @property
    def kernel(self) -> Path:
        return self.root / "vmlinuz"

    @property
    def initrd(self) -> Path:
        return self.root / "initrd.img"

    @property
    def ssh_key(self) -> Path:
        return self.root / "id_ed25519"


def image_key() -> str:
    """Hash of every input that shapes the image; a change to any of them builds a new one."""
    digest = hashlib.sha256()
    for part in (SUITE, MIRROR, IMAGE_SIZE, *BASE_PACKAGES, *ROLE_PACKAGES, CHROOT_SCRIPT):
        digest.update(part.encode() + b"\0")
    for name, text in sorted(ROOTFS_FILES.items()):
        digest.update(name.encode() + b"\0" + text.encode() + b"\0")
    return digest.hexdigest()[:16]


TARGETS = ("container", "vm")

# Host commands each target needs (building the image needs the first three).
HOST_TOOLS = {
    "vm": ("debootstrap", "mkfs.ext4", "ssh-keygen", "ssh", "qemu-system-x86_64", "qemu-img"),
    "container": ("debootstrap", "mkfs.ext4", "ssh-keygen", "ssh", "systemd-nspawn", "ip", "iptables", "mount", "umount"),
}


def choose_target() -> str:
    """``DLTS_CI_TARGET`` when set, else the VM where KVM is usable and the container elsewhere."""
    forced = os.environ.get("DLTS_CI_TARGET", "").strip()
    if forced:
        if forced not in TARGETS:
            raise ValueError(f"DLTS_CI_TARGET must be one of {', '.join(TARGETS)}, not {forced!r}")
        return forced
    return "vm" if ACCEL == "kvm" else "container"


def missing_host_tools(target: str | None = None) -> list[str]:
    """Host commands a target needs (default: the one boot_target() picks); the test asserts none miss."""
    return [tool for tool in HOST_TOOLS[target or choose_target()] if _which(tool) is None]


def _which(tool: str) -> str | None:
    # sbin tools (ip, iptables, mkfs.ext4) are missing from the PATH of some non-login shells.
    return shutil.which(tool) or shutil.which(tool, path="/usr/sbin:/sbin:/usr/bin:/bin")


def _run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=True, **kwargs)


def build_image(log=sys.stderr) -> Image:
    """Return the cached image, building it first if this key has never been built."""
    image = Image(CACHE_ROOT / f"debian-{SUITE}-{image_key()}")
    if (image.root / "READY").exists():
        return image
    CACHE_ROOT.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="build-", dir=CACHE_ROOT))
    try:
        rootfs = work / "rootfs"
        print(f"dlts-ci: debootstrapping {SUITE} into {rootfs} (cached afterwards)", file=log)
        _run(
            [
                "debootstrap",
                "--variant=minbase",
                "--include=" + ",".join(BASE_PACKAGES + ROLE_PACKAGES),
                SUITE,
                str(rootfs),
                MIRROR,
            ],
            stdout=subprocess.DEVNULL,
        )
        for name, text in ROOTFS_FILES.items():
            target = rootfs / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
        # Daemons must not start inside the build chroot.
        policy = rootfs / "usr/sbin/policy-rc.d"
        policy.write_text("#!/bin/sh\nexit 101\n")
        policy.chmod(0o755)
        _run(["chroot", str(rootfs), "/bin/sh", "-c", CHROOT_SCRIPT], stdout=subprocess.DEVNULL)
        policy.unlink()
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(work / "id_ed25519")])
        ssh_dir = rootfs / "root/.ssh"
        ssh_dir.mkdir(mode=0o700, exist_ok=True)
        shutil.copy(work / "id_ed25519.pub", ssh_dir / "authorized_keys")
        (ssh_dir / "authorized_keys").chmod(0o600)
        # Kernel and initrd are booted directly by qemu (no boot loader to install).
        boot = rootfs / "boot"
        shutil.copy(next(boot.glob("vmlinuz-*")), work / "vmlinuz")
        shutil.copy(next(boot.glob("initrd.img-*")), work / "initrd.img")
        _run(
            ["mkfs.ext4", "-q", "-L", "dltsroot", "-d", str(rootfs), str(work / "rootfs.raw"), IMAGE_SIZE],
        )
        shutil.rmtree(rootfs)
        (work / "READY").write_text(image_key() + "\n")
        if image.root.exists():
            shutil.rmtree(image.root)
        work.rename(image.root)
        # Images of older keys are dead weight (each is a 6 GB sparse file).
        for old in CACHE_ROOT.glob(f"debian-{SUITE}-*"):
            if old != image.root:
                shutil.rmtree(old, ignore_errors=True)
        return image
    finally:
        _unmount_below(work)
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)


def _unmount_below(root: Path) -> None:
    """debootstrap mounts /proc and /sys inside the root; an interrupted build may leave them."""
    mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
    for mount in sorted((m for m in mounts if m.startswith(str(root) + "/")), reverse=True):
        subprocess.run(["umount", "--lazy", mount], check=False)


_SSH_OPTIONS = (
    "-o", "BatchMode=yes",
    "-o", "StrictHostKeyChecking=no",
    "-o", "UserKnownHostsFile=/dev/null",
    "-o", "LogLevel=ERROR",
    "-o", "ConnectTimeout=5",
)


def free_port() -> int:
    with contextlib.closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class DebianVM:
    """A booted throwaway VM; use as a context manager. ``ports`` maps guest ports to host ports."""

    def __init__(self, image: Image, workdir: Path, guest_ports: tuple[int, ...] = (), memory_mib: int = 2048):
        self.image = image
        self.workdir = workdir
        self.memory_mib = memory_mib
        self.ssh_port = free_port()
        self.ports = {port: free_port() for port in guest_ports}
        self.console_log = workdir / "console.log"
        self._proc: subprocess.Popen | None = None

    def __enter__(self) -> Self:
        overlay = self.workdir / "disk.qcow2"
        _run(
            ["qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", str(self.image.disk), str(overlay)],
        )
        forwards = "".join(
            f",hostfwd=tcp:127.0.0.1:{host}-:{guest}" for guest, host in [(22, self.ssh_port), *self.ports.items()]
        )
        cmd = [
            "qemu-system-x86_64",
            "-accel", ACCEL,
            "-cpu", "max",
            "-smp", "2",
            "-m", str(self.memory_mib),
            "-nodefaults",
            "-display", "none",
            "-serial", f"file:{self.console_log}",
            "-kernel", str(self.image.kernel),
            "-initrd", str(self.image.initrd),
            "-append", "root=LABEL=dltsroot rw console=ttyS0 net.ifnames=0 quiet",
            "-drive", f"file={overlay},if=virtio,format=qcow2,discard=unmap",
            "-netdev", f"user,id=net0{forwards}",
            "-device", "virtio-net-pci,netdev=net0",
        ]
        self._proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            self.wait_for_ssh(timeout_s=180)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def ssh_base(self) -> list[str]:
        return [
            "ssh",
            "-i", str(self.image.ssh_key),
            "-p", str(self.ssh_port),
            *_SSH_OPTIONS,
            "root@127.0.0.1",
        ]

    def ssh(self, command: str, timeout_s: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(
            self.ssh_base() + [command], capture_output=True, text=True, timeout=timeout_s, check=False
        )

    def wait_for_ssh(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.poll() is not None:
                stderr = self._proc.stderr.read().decode() if self._proc.stderr else ""
                raise RuntimeError(f"qemu exited with {self._proc.returncode}: {stderr}")
            try:
                if self.ssh("true", timeout_s=15).returncode == 0:
                    return
            except subprocess.TimeoutExpired:
                pass
            time.sleep(1)
        tail = self.console_log.read_text(errors="replace")[-3000:] if self.console_log.exists() else ""
        raise TimeoutError(f"VM did not answer SSH within {timeout_s} s; console tail:\n{tail}")

    def inventory_vars(self) -> dict[str, str]:
        return {
            "ansible_host": "127.0.0.1",
            "ansible_port": str(self.ssh_port),
            "ansible_user": "root",
            "ansible_ssh_private_key_file": str(self.image.ssh_key),
            "ansible_ssh_common_args": "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null",
            "ansible_python_interpreter": "/usr/bin/python3",
        }

    def __exit__(self, *exc) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None


# -- systemd-nspawn container --------------------------------------------------------------------

# Every name a container leaves on the host carries its token, "<owner pid in hex>x<counter>", so
# that a later run can tell the leftovers of a crashed run (owner gone) from a live neighbour.
NETNS_PREFIX = "dltsci-"  # network namespace and machine name
VETH_PREFIX = "vdlts"  # host end of the veth pair (interface names have at most 15 characters)
ROOT_PREFIX = "dltsct-"  # directory in the workdir holding lower/, upper/, work/ and merged/
SUBNET_PREFIX = "10.213"  # each container gets 10.213.N.0/24: .1 is the host, .2 the guest
LOCK_PATH = Path("/run/lock/dlts-ci-containers.lock")
_TOKEN = re.compile(r"([0-9a-f]+)x([0-9]+)")
_counter = itertools.count()

# Units allowed to be failed once the container has booted. Everything the image enables works in
# a container once the per-boot files below are in place; a unit added here needs a reason.
EXPECTED_FAILED_UNITS: frozenset[str] = frozenset()

HOST0_NETWORK = """\
# Written per boot by tests/ansible/dlts_vm.py: host0 is the container's end of the veth pair.
[Match]
Name=host0

[Network]
Address={guest_ip}/24
Gateway={host_ip}
{dns}LinkLocalAddressing=no
IPv6AcceptRA=no
"""
# The image's fstab names the VM's disk (LABEL=dltsroot); in the container the root file system is
# the overlay systemd-nspawn was given, so there is nothing to mount or remount.
CONTAINER_FSTAB = "# The root file system is the overlay systemd-nspawn boots from (tests/ansible/dlts_vm.py).\n"


def _host_nameservers() -> list[str]:
    """The host's resolvers the guest can reach through NAT (a loopback resolver is not reachable)."""
    try:
        lines = Path("/etc/resolv.conf").read_text().splitlines()
    except OSError:
        return []
    servers = [line.split()[1] for line in lines if line.startswith("nameserver") and len(line.split()) > 1]
    return [server for server in servers if not server.startswith("127.") and server != "::1"]


def _owner_alive(token: str) -> bool:
    """Whether the test process that made a container still runs (unknown names count as alive)."""
    match = _TOKEN.fullmatch(token)
    if match is None:
        return True
    try:
        stat = Path(f"/proc/{int(match.group(1), 16)}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def _quiet(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, check=False)


@contextlib.contextmanager
def _host_lock():
    """Serialises subnet allocation and leftover cleanup between concurrent test processes."""
    LOCK_PATH.parent.mkdir(parents=True, exist_ok=True)
    with LOCK_PATH.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _nspawn_pids() -> dict[str, int]:
    """Running systemd-nspawn processes of this module, by token."""
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if not argv or not argv[0].endswith(b"systemd-nspawn"):
            continue
        for arg in argv:
            if arg.startswith(f"--machine={NETNS_PREFIX}".encode()):
                found[arg.decode().split("=", 1)[1][len(NETNS_PREFIX):]] = int(proc.name)
    return found


def _stop_nspawn(pid: int, proc: subprocess.Popen | None = None, timeout_s: float = 30) -> None:
    """SIGTERM makes systemd-nspawn shut the container down in order; SIGKILL its init after timeout_s."""

    def gone() -> bool:
        if proc is not None:
            return proc.poll() is not None
        try:
            return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
        except OSError:
            return True

    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while not gone() and time.monotonic() < deadline:
        time.sleep(0.2)
    if gone():
        return
    # The container's init is nspawn's child; killing it ends every process of the container.
    children = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        with contextlib.suppress(OSError):
            children += [int(child) for child in task.read_text().split()]
    for child in [*children, pid]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while not gone() and time.monotonic() < deadline:
        time.sleep(0.2)


def _umount(path: str) -> None:
    for _ in range(10):
        if _quiet(["umount", path]).returncode == 0:
            return
        time.sleep(0.5)
    _quiet(["umount", "--lazy", path])


def _iptables_rules(token_filter) -> list[tuple[str, list[str]]]:
    """(table, rule spec) of the NAT/forward rules whose comment names a matching container."""
    rules = []
    if _which("iptables") is None:
        return rules
    for table in ("nat", "filter"):
        listing = _quiet(["iptables", "-w", "-t", table, "-S"]).stdout
        for line in listing.splitlines():
            words = shlex.split(line)
            if words[:1] != ["-A"] or "--comment" not in words:
                continue
            comment = words[words.index("--comment") + 1]
            if comment.startswith(NETNS_PREFIX) and token_filter(comment[len(NETNS_PREFIX):]):
                rules.append((table, words[1:]))
    return rules


def reap_stale_containers(log=sys.stderr) -> None:
    """Remove what containers of dead test processes left behind: nspawn, mounts, netns, veth, rules."""
    def stale(token: str) -> bool:
        return not _owner_alive(token)

    for token, pid in _nspawn_pids().items():
        if stale(token):
            print(f"dlts-ci: stopping leftover container {NETNS_PREFIX}{token} (pid {pid})", file=log)
            _stop_nspawn(pid)
    mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    leftovers = []
    for mount in mounts:
        match = re.search(rf"/{re.escape(ROOT_PREFIX)}([0-9a-fx]+)/(merged|lower)$", mount)
        if match and stale(match.group(1)):
            leftovers.append((match.group(2) == "lower", mount))  # the overlay before its lower layer
    for _, mount in sorted(leftovers):
        print(f"dlts-ci: unmounting leftover {mount}", file=log)
        _umount(mount)
    for line in _quiet(["ip", "netns", "list"]).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        if name.startswith(NETNS_PREFIX) and stale(name[len(NETNS_PREFIX):]):
            print(f"dlts-ci: deleting leftover network namespace {name}", file=log)
            _quiet(["ip", "netns", "delete", name])
    for line in _quiet(["ip", "-o", "link", "show"]).stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0] if line.count(":") >= 2 else ""
        if name.startswith(VETH_PREFIX) and stale(name[len(VETH_PREFIX):]):
            print(f"dlts-ci: deleting leftover interface {name}", file=log)
            _quiet(["ip", "link", "delete", name])
    for table, rule in _iptables_rules(stale):
        _quiet(["iptables", "-w", "-t", table, "-D", *rule])


def _free_subnet(start: int) -> int:
    """The third octet of a 10.213.N.0/24 that no host address or route uses yet."""
    used = _quiet(["ip", "-o", "-4", "addr", "show"]).stdout + _quiet(["ip", "-4", "route", "show", "table", "all"]).stdout
    for offset in range(254):
        candidate = (start + offset) % 254 + 1
        if f" {SUBNET_PREFIX}.{candidate}." not in used:
            return candidate
    raise RuntimeError(f"no free /24 left in {SUBNET_PREFIX}.0.0/16 for a container")


class DebianContainer:
    """The image booted with systemd-nspawn (real systemd as PID 1); use as a context manager.

    The container has its own network namespace, joined to the host by a veth pair: the host is
    ``host_ip``, the guest ``guest_ip``, and every guest port is reachable at the guest's address.
    Its writable layer is an overlay upper directory in ``workdir``; the image stays read-only.
    """

    def __init__(self, image: Image, workdir: Path, guest_ports: tuple[int, ...] = ()):
        self.image = image
        self.workdir = workdir
        self.guest_ports = tuple(guest_ports)
        self.token = f"{os.getpid():x}x{next(_counter)}"
        self.name = NETNS_PREFIX + self.token
        self.veth = VETH_PREFIX + self.token
        if len(self.veth) > 15:
            raise ValueError(f"interface name {self.veth} is longer than 15 characters")
        self.root = workdir / (ROOT_PREFIX + self.token)
        self.console_log = workdir / f"console-{self.name}.log"
        self.host_ip = ""
        self.guest_ip = ""
        self._proc: subprocess.Popen | None = None
        self._mounted: list[Path] = []
        self._netns = False
        self._rules: list[tuple[str, list[str]]] = []
        self.boot_state = ""

    # -- life cycle

    def __enter__(self) -> Self:
        try:
            with _host_lock():
                reap_stale_containers()
                self._network()
            self._mount()
            self._boot()
            self.wait_until_booted(timeout_s=240)
        except BaseException:
            self.__exit__(*sys.exc_info())
            raise
        return self

    def _network(self) -> None:
        octet = _free_subnet(start=os.getpid() % 254)
        net = f"{SUBNET_PREFIX}.{octet}"
        self.host_ip, self.guest_ip = f"{net}.1", f"{net}.2"
        _run(["ip", "netns", "add", self.name])
        self._netns = True
        _run(["ip", "link", "add", self.veth, "type", "veth", "peer", "name", "host0", "netns", self.name])
        _run(["ip", "addr", "add", f"{self.host_ip}/24", "dev", self.veth])
        _run(["ip", "link", "set", self.veth, "up"])
        # The guest's own systemd-networkd gives host0 its address (HOST0_NETWORK), as on a real host.
        # The guest reaches the outside (apt mirrors) through NAT, as qemu's user network gives the
        # VM; forwarding stays on afterwards, since other containers may still need it.
        Path("/proc/sys/net/ipv4/ip_forward").write_text("1\n")
        comment = ["-m", "comment", "--comment", self.name]
        for table, rule in (
            ("nat", ["POSTROUTING", "-s", f"{net}.0/24", "!", "-o", self.veth, *comment, "-j", "MASQUERADE"]),
            ("filter", ["FORWARD", "-i", self.veth, *comment, "-j", "ACCEPT"]),
            ("filter", ["FORWARD", "-o", self.veth, *comment, "-j", "ACCEPT"]),
        ):
            _run(["iptables", "-w", "-t", table, "-A", *rule])
            self._rules.append((table, rule))

    def _mount(self) -> None:
        lower, upper, work, merged = (self.root / part for part in ("lower", "upper", "work", "merged"))
        for directory in (lower, upper, work, merged):
            directory.mkdir(parents=True)
        # Per-boot files go into the upper directory before the overlay is mounted; the image (and
        # with it image_key()) is left as the VM boots it.
        dns = "".join(f"DNS={server}\n" for server in _host_nameservers())
        for name, text in {
            "etc/fstab": CONTAINER_FSTAB,
            "etc/systemd/network/05-dlts-ci-host0.network": HOST0_NETWORK.format(
                guest_ip=self.guest_ip, host_ip=self.host_ip, dns=dns
            ),
        }.items():
            (upper / name).parent.mkdir(parents=True, exist_ok=True)
            (upper / name).write_text(text)
        _run(["mount", "-o", "loop,ro,noload", str(self.image.disk), str(lower)])
        self._mounted.append(lower)
        _run(["mount", "-t", "overlay", "overlay", "-o", f"lowerdir={lower},upperdir={upper},workdir={work}", str(merged)])
        self._mounted.append(merged)

    def _boot(self) -> None:
        cmd = [
            "systemd-nspawn",
            "--boot",
            f"--directory={self.root / 'merged'}",
            f"--machine={self.name}",
            # The CI hosts run no systemd or D-Bus to register with or to ask for a scope.
            "--register=no",
            "--keep-unit",
            f"--network-namespace-path=/run/netns/{self.name}",
            # The namespace is the container's own: systemd-networkd (which needs CAP_NET_ADMIN)
            # configures host0 in it as on a real host, and nothing of the host's network is exposed.
            "--capability=CAP_NET_ADMIN",
            "--resolv-conf=off",
            "--console=read-only",
            # NFS-Ganesha's VFS back end opens files by handle (open_by_handle_at), which nspawn's
            # default system call filter refuses; the container holds CAP_DAC_READ_SEARCH already.
            "--system-call-filter=open_by_handle_at",
        ]
        with self.console_log.open("wb") as log:
            self._proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)

    def wait_until_booted(self, timeout_s: float) -> None:
        """SSH answers, systemd reached running (or degraded by an expected unit only)."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self._proc is not None and self._proc.poll() is not None:
                raise RuntimeError(f"systemd-nspawn exited with {self._proc.returncode}:\n{self._console_tail()}")
            try:
                if self.ssh("true", timeout_s=15).returncode == 0:
                    break
            except subprocess.TimeoutExpired:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"container did not answer SSH within {timeout_s} s:\n{self._console_tail()}")
            time.sleep(0.5)
        left = max(deadline - time.monotonic(), 30)
        state = self.ssh("systemctl is-system-running --wait", timeout_s=left).stdout.strip()
        listing = self.ssh("systemctl list-units --failed --plain --no-legend --no-pager").stdout
        failed = {word for line in listing.splitlines() for word in line.split()[:2] if word != "●"}
        failed = {unit for unit in failed if "." in unit}
        if state not in ("running", "degraded") or failed - EXPECTED_FAILED_UNITS:
            details = self.ssh(
                "systemctl --failed --no-pager; journalctl -b --no-pager -p warning | tail -n 60", timeout_s=60
            )
            raise RuntimeError(
                f"container booted to state {state!r} with unexpected failed units "
                f"{sorted(failed - EXPECTED_FAILED_UNITS)}:\n{details.stdout}{details.stderr}"
            )
        self.boot_state = state

    def _mounted_anywhere(self) -> bool:
        return f"/{self.root.name}/" in Path("/proc/self/mounts").read_text()

    def _console_tail(self) -> str:
        return self.console_log.read_text(errors="replace")[-3000:] if self.console_log.exists() else ""

    def __exit__(self, *exc) -> None:
        errors = []
        if self._proc is not None:
            _stop_nspawn(self._proc.pid, self._proc)
            self._proc = None
        for mount in reversed(self._mounted):
            _umount(str(mount))
        self._mounted = []
        for table, rule in self._rules:
            result = _quiet(["iptables", "-w", "-t", table, "-D", *rule])
            if result.returncode:
                errors.append(result.stderr.strip())
        self._rules = []
        if self._netns:
            # Deleting the namespace destroys host0 and with it the host end of the veth pair.
            result = _quiet(["ip", "netns", "delete", self.name])
            if result.returncode:
                errors.append(result.stderr.strip())
            self._netns = False
        if _quiet(["ip", "link", "show", self.veth]).returncode == 0:
            _quiet(["ip", "link", "delete", self.veth])
        # The writable layer (a few hundred MB after a converge) is kept only when something failed,
        # for its journal and files; the console log stays either way.
        if exc and exc[0] is None and not self._mounted_anywhere():
            shutil.rmtree(self.root, ignore_errors=True)
        if errors:
            print(f"dlts-ci: cleanup of {self.name}: {'; '.join(errors)}", file=sys.stderr)

    # -- access

    def ssh_base(self) -> list[str]:
        return ["ssh", "-i", str(self.image.ssh_key), *_SSH_OPTIONS, f"root@{self.guest_ip}"]

    def ssh(self, command: str, timeout_s: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(
            self.ssh_base() + [command], capture_output=True, text=True, timeout=timeout_s, check=False
        )

    def endpoint(self, guest_port: int) -> str:
        """``host:port`` where the host reaches a guest port (the guest's own address)."""
        return f"{self.guest_ip}:{guest_port}"

    @property
    def second_host_ip(self) -> str:
        """A second address of the host on the container's /24 (see from_second_host_ip)."""
        return self.host_ip.rsplit(".", 1)[0] + ".3"

    @contextlib.contextmanager
    def from_second_host_ip(self) -> Iterator[str]:
        """While inside, the host's new connections to the guest leave from second_host_ip: the guest
        sees a second client (a service that serves clients by address, such as NFS, can be checked
        from both). Connections already open keep their address."""
        address = self.second_host_ip
        _run(["ip", "addr", "add", f"{address}/32", "dev", self.veth])
        try:
            _run(["ip", "route", "add", f"{self.guest_ip}/32", "dev", self.veth, "src", address])
            try:
                yield address
            finally:
                _quiet(["ip", "route", "del", f"{self.guest_ip}/32", "dev", self.veth, "src", address])
        finally:
            _quiet(["ip", "addr", "del", f"{address}/32", "dev", self.veth])

    def inventory_vars(self) -> dict[str, str]:
        return {
            "ansible_host": self.guest_ip,
            "ansible_port": "22",
            "ansible_user": "root",
            "ansible_ssh_private_key_file": str(self.image.ssh_key),
            "ansible_ssh_common_args": "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null",
            "ansible_python_interpreter": "/usr/bin/python3",
        }


def boot_target(
    image: Image, workdir: Path, guest_ports: tuple[int, ...] = (), target: str | None = None
) -> DebianVM | DebianContainer:
    """The machine to converge into (not started yet): ``target``, else choose_target()'s pick."""
    target = target or choose_target()
    if target == "vm":
        return DebianVM(image, workdir, guest_ports)
    if target == "container":
        return DebianContainer(image, workdir, guest_ports)
    raise ValueError(f"unknown target {target!r}: expected one of {', '.join(TARGETS)}")


if __name__ == "__main__":
    args = sys.argv[1:]
    if args == ["build"]:
        print(build_image().root)
    elif args[:1] == ["boot"] and len(args) <= 2:
        image = build_image()
        with (
            tempfile.TemporaryDirectory(prefix="dlts-boot-") as tmp,
            boot_target(image, Path(tmp), target=(args[1:] or [None])[0]) as machine,
        ):
            print(" ".join(shlex.quote(word) for word in machine.ssh_base()))
            print("booted; press Ctrl-C to stop it", file=sys.stderr)
            with contextlib.suppress(KeyboardInterrupt):
                signal.pause()
    else:
        sys.exit("usage: dlts_vm.py build | boot [container|vm]")
