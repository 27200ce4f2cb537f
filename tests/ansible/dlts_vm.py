"""Disposable Debian VMs for the converge test: image cache, boot, SSH.

This module owns the throwaway machine that the Ansible converge test deploys into. CI machines
have no systemd as PID 1 and no container engine, but /dev/kvm works, so the honest target is a
real Debian 12 system with systemd, booted under qemu/KVM and reached over SSH on a loopback port
forward:

* ``build_image()`` debootstraps a root file system once, packs it into a raw ext4 image with
  ``mkfs.ext4 -d`` (no loop devices needed) and keeps it under ``/var/cache/dlts-ci/`` keyed by a
  hash of everything that shapes it, so reruns reuse it.
* ``DebianVM`` boots that image read-only behind a qcow2 overlay (each test gets a fresh disk),
  waits for SSH, and kills qemu on exit.

Run ``python tests/ansible/dlts_vm.py build`` to warm the cache by hand.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

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
# the second block is what the mariadb, dlts_control and dlts_agent roles install, pre-seeded so
# that the converge does not spend CI minutes downloading them (the roles still assert them with
# ansible.builtin.apt, which then reports "ok").
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
    "python3-pymysql",
    "python3-venv",
    "python3-pip",
    "nginx",
    "ssl-cert",
    "openssl",
    "chrony",
    "rsync",
    "pciutils",
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
systemctl disable mariadb nginx chrony || true
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


def missing_host_tools() -> list[str]:
    """Host commands the VM route needs; the converge test asserts this list is empty."""
    tools = ("debootstrap", "mkfs.ext4", "qemu-system-x86_64", "qemu-img", "ssh", "ssh-keygen")
    return [tool for tool in tools if shutil.which(tool) is None]


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

    def __enter__(self) -> "DebianVM":
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
            "-o", "BatchMode=yes",
            "-o", "StrictHostKeyChecking=no",
            "-o", "UserKnownHostsFile=/dev/null",
            "-o", "LogLevel=ERROR",
            "-o", "ConnectTimeout=5",
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


if __name__ == "__main__":
    if sys.argv[1:] != ["build"]:
        sys.exit("usage: dlts_vm.py build")
    print(build_image().root)
