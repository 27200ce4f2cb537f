"""The build-once cache of a real Kubernetes for the real-cluster tests.

Builds, from Debian 12's own packages and nothing else, what ``cluster.py`` starts:

* ``bin/``: kube-apiserver, kube-controller-manager, kube-scheduler and kubelet, built from
  Debian's ``kubernetes`` source package (upstream 1.20) with Debian's Go 1.19. Kubernetes 1.20
  vendors ``github.com/modern-go/reflect2`` 1.0.1, which is broken on Go >= 1.18 (every JSON
  request for an object with a map in it panics in the API server), so Debian's reflect2 1.0.2
  replaces the vendored sources before the build.
* ``images/``: docker-archive tarballs that containerd imports, so that no pod ever pulls:
  ``pause`` (a static C program of this file's own), the busybox image that the backend's init
  container runs (``kubernetes.init_image``), and a small shell image for the jobs
  (``dlts.test/shell:1``: busybox applets, ``/bin/sh``, a ``/etc/passwd``).

The result lives under ``/var/cache/dlts-ci/kube-<key>/`` (``DLTS_CI_CACHE`` moves the root), keyed
by a hash of what shapes it (``RECIPE``, bumped when the steps change; the versions of the source
package, Go, reflect2 and busybox; the pause program and the image names), so it is built once
(350-440 s on 2 cores) and reused until one of them changes. Everything else the cluster needs
(etcd, containerd, runc, the CNI plugins, openssl, iptables) is installed from Debian here too.

``python tests/k8s/real/kube_cache.py build`` builds (or finds) it and prints its directory;
``.ci/dev setup`` runs that, so the README's test command and CI both have it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

CACHE_ROOT = Path(os.environ.get("DLTS_CI_CACHE", "/var/cache/dlts-ci"))
RECIPE = 1  # bump when the build or image steps below change what they produce
SOURCE_PACKAGE = "kubernetes"
BINARIES = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet")
REFLECT2_DIR = Path("/usr/share/gocode/src/github.com/modern-go/reflect2")
GO_BIN = Path("/usr/lib/go-1.19/bin")
APT_PACKAGES = (
    "golang-1.19-go", "dpkg-dev", "golang-github-modern-go-reflect2-dev", "etcd-server", "containerd", "runc",
    "containernetworking-plugins", "busybox-static", "iptables", "conntrack", "openssl", "gcc", "libc6-dev", "make",
)

# Image names the tests use. The init image is the backend's default `kubernetes.init_image`.
PAUSE_IMAGE = "dlts.test/pause:1"
INIT_IMAGE = "docker.io/library/busybox:1.36.1"
SHELL_IMAGE = "dlts.test/shell:1"

# pause: the sandbox's first process. It holds the pod's namespaces, ends on TERM or INT, and reaps
# the orphans of a pod that shares one process namespace.
PAUSE_C = r"""
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_stop(int sig) { (void)sig; _exit(0); }
static void on_child(int sig) { (void)sig; while (waitpid(-1, NULL, WNOHANG) > 0) {} }

int main(void) {
    struct sigaction stop = {0}, child = {0};
    stop.sa_handler = on_stop;
    child.sa_handler = on_child;
    child.sa_flags = SA_NOCLDSTOP | SA_RESTART;
    if (sigaction(SIGINT, &stop, NULL) || sigaction(SIGTERM, &stop, NULL) || sigaction(SIGCHLD, &child, NULL))
        return 1;
    for (;;) pause();
}
"""

PASSWD = "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/sh\n"
GROUP = "root:x:0:\nnogroup:x:65534:\n"


def log(message: str) -> None:
    print(f"kube-cache: {message}", file=sys.stderr, flush=True)


def run(argv: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, check=True, text=True, **kwargs)  # type: ignore[call-overload]


def _apt_env() -> dict[str, str]:
    return {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}


def ensure_packages() -> None:
    """Install the Debian packages the build and the cluster need (apt-get update once if any is missing)."""
    missing = [p for p in APT_PACKAGES
               if subprocess.run(["dpkg-query", "-W", "-f=${Status}", p], capture_output=True, text=True)
               .stdout != "install ok installed"]
    if missing:
        log(f"installing with apt: {' '.join(missing)}")
        run(["apt-get", "update", "-qq"], env=_apt_env())
        run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing], env=_apt_env(),
            stdout=subprocess.DEVNULL)


def ensure_deb_src() -> None:
    """Add `deb-src` twins of the machine's deb822 `deb` entries (same URIs, suites, keys) when apt has no source list."""
    if _source_version():
        return
    target = Path("/etc/apt/sources.list.d/dlts-ci-deb-src.sources")
    stanzas = []
    for path in sorted(Path("/etc/apt/sources.list.d").glob("*.sources")):
        if path == target:
            continue
        for stanza in path.read_text().split("\n\n"):
            lines = [line for line in stanza.splitlines() if line.strip() and not line.startswith("#")]
            if any(line.split(":", 1)[0] == "Types" and "deb" in line.split(":", 1)[1].split() for line in lines):
                stanzas.append("\n".join("Types: deb-src" if line.startswith("Types:") else line for line in lines))
    if not stanzas:
        raise SystemExit("kube-cache: no deb822 'deb' entry under /etc/apt/sources.list.d to add a deb-src twin for")
    target.write_text("\n\n".join(stanzas) + "\n")
    log(f"added {target}; apt-get update")
    run(["apt-get", "update", "-qq"], env=_apt_env())
    if not _source_version():
        raise SystemExit(f"kube-cache: apt knows no source package {SOURCE_PACKAGE!r} even with {target}")


def _source_version() -> str:
    """The newest version of the source package that apt can fetch ('' when it knows none)."""
    out = subprocess.run(["apt-cache", "showsrc", SOURCE_PACKAGE], capture_output=True, text=True).stdout
    versions = [line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Version:")]
    if not versions:
        return ""
    return max(versions, key=_DebVersion)


class _DebVersion:
    def __init__(self, version: str) -> None:
        self.version = version

    def __lt__(self, other: _DebVersion) -> bool:
        return subprocess.run(["dpkg", "--compare-versions", self.version, "lt", other.version]).returncode == 0


def _installed_version(package: str) -> str:
    return subprocess.run(["dpkg-query", "-W", "-f=${Version}", package], capture_output=True, text=True).stdout


def cache_key(source_version: str) -> str:
    inputs = [str(RECIPE), source_version, *BINARIES, PAUSE_C, PASSWD, GROUP, PAUSE_IMAGE, INIT_IMAGE, SHELL_IMAGE,
              *(_installed_version(p) for p in ("golang-github-modern-go-reflect2-dev", "golang-1.19-go", "busybox-static"))]
    return hashlib.sha256("\0".join(inputs).encode()).hexdigest()[:16]


def _build_binaries(version: str, out: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="dlts-kube-build.", dir="/var/tmp") as work:
        log(f"fetching the {SOURCE_PACKAGE} {version} source package")
        run(["apt-get", "source", "--download-only", f"{SOURCE_PACKAGE}={version}"], cwd=work,
            stdout=subprocess.DEVNULL)
        dsc = next(Path(work).glob("*.dsc"))
        run(["dpkg-source", "-x", str(dsc), "src"], cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        src = Path(work) / "src"
        vendored = src / "vendor/github.com/modern-go/reflect2"
        copied = 0
        for old in vendored.iterdir():  # 1.0.1's files that 1.0.2 dropped (go_above_17.go) must go too
            if old.suffix in (".go", ".s"):
                old.unlink()
        for file in REFLECT2_DIR.iterdir():
            if file.suffix in (".go", ".s"):
                shutil.copy2(file, vendored / file.name)
                copied += 1
        if not copied:
            raise SystemExit(f"kube-cache: no reflect2 sources in {REFLECT2_DIR}")
        log(f"patched vendored reflect2 with {copied} files of Debian's; building {', '.join(BINARIES)} (6-8 min)")
        env = {**os.environ, "PATH": f"{GO_BIN}:{os.environ['PATH']}", "CGO_ENABLED": "0", "GOFLAGS": "",
               "GOPROXY": "off"}
        started = time.monotonic()
        what = " ".join(f"cmd/{name}" for name in BINARIES)
        build_log = Path(work) / "make.log"
        with build_log.open("w") as sink:
            result = subprocess.run(["make", f"WHAT={what}"], cwd=src, env=env, stdout=sink, stderr=subprocess.STDOUT)
        if result.returncode:
            sys.stderr.write(build_log.read_text()[-6000:])
            raise SystemExit(f"kube-cache: make failed (exit {result.returncode}); its last lines are above")
        log(f"built in {time.monotonic() - started:.0f} s")
        (out / "bin").mkdir(parents=True, exist_ok=True)
        for name in BINARIES:
            shutil.copy2(src / "_output/bin" / name, out / "bin" / name)


def _add(tar: tarfile.TarFile, name: str, *, data: bytes | None = None, mode: int = 0o644,
         kind: bytes = tarfile.REGTYPE, link: str = "") -> None:
    info = tarfile.TarInfo(name)
    info.mode = mode
    info.type = kind
    info.linkname = link
    info.mtime = 0
    if data is not None:
        info.size = len(data)
    tar.addfile(info, io.BytesIO(data) if data is not None else None)


def _busybox_layer(tar: tarfile.TarFile, *, with_etc: bool) -> None:
    busybox = Path("/bin/busybox").read_bytes()
    applets = run(["/bin/busybox", "--list"], capture_output=True).stdout.split()
    for directory in ("bin", "tmp", "etc", "root", "home", "dev", "proc", "sys"):
        _add(tar, directory, kind=tarfile.DIRTYPE, mode=0o1777 if directory == "tmp" else 0o755)
    _add(tar, "bin/busybox", data=busybox, mode=0o755)
    for applet in applets:
        if applet != "busybox":
            _add(tar, f"bin/{applet}", kind=tarfile.SYMTYPE, link="busybox")
    if with_etc:
        _add(tar, "etc/passwd", data=PASSWD.encode())
        _add(tar, "etc/group", data=GROUP.encode())


def write_image(path: Path, name: str, fill: object, config: dict[str, object]) -> None:
    """A one-layer docker-archive (`docker save` format) named `name`, its layer written by `fill(tar)`."""
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w", format=tarfile.GNU_FORMAT) as tar:
        fill(tar)  # type: ignore[operator]
    layer_bytes = layer.getvalue()
    diff_id = hashlib.sha256(layer_bytes).hexdigest()
    image_config = json.dumps({
        "architecture": "amd64", "os": "linux", "created": "1970-01-01T00:00:00Z",
        "config": config, "rootfs": {"type": "layers", "diff_ids": [f"sha256:{diff_id}"]},
        "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "tests/k8s/real/kube_cache.py"}],
    }, sort_keys=True).encode()
    config_name = hashlib.sha256(image_config).hexdigest() + ".json"
    manifest = json.dumps([{"Config": config_name, "RepoTags": [name], "Layers": [f"{diff_id}/layer.tar"]}]).encode()
    with tarfile.open(path, "w") as archive:
        _add(archive, f"{diff_id}", kind=tarfile.DIRTYPE, mode=0o755)
        _add(archive, f"{diff_id}/layer.tar", data=layer_bytes)
        _add(archive, config_name, data=image_config)
        _add(archive, "manifest.json", data=manifest)


def _build_images(out: Path) -> None:
    images = out / "images"
    images.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="dlts-pause.") as work:
        source = Path(work) / "pause.c"
        source.write_text(PAUSE_C)
        binary = Path(work) / "pause"
        run(["gcc", "-Os", "-static", "-o", str(binary), str(source)])
        run(["strip", str(binary)])
        pause = binary.read_bytes()
    write_image(images / "pause.tar", PAUSE_IMAGE, lambda tar: _add(tar, "pause", data=pause, mode=0o755),
                {"Entrypoint": ["/pause"]})
    write_image(images / "init.tar", INIT_IMAGE, lambda tar: _busybox_layer(tar, with_etc=False),
                {"Cmd": ["sh"], "Env": ["PATH=/bin"]})
    write_image(images / "shell.tar", SHELL_IMAGE, lambda tar: _busybox_layer(tar, with_etc=True),
                {"Cmd": ["sh"], "Env": ["PATH=/bin"]})
    (images / "names.json").write_text(json.dumps({"pause": PAUSE_IMAGE, "init": INIT_IMAGE, "shell": SHELL_IMAGE}))


def build() -> Path:
    """Return the cache directory, building it first if this key has never been built."""
    ensure_packages()
    ensure_deb_src()
    version = _source_version()
    out = CACHE_ROOT / f"kube-{cache_key(version)}"
    stamp = out / "stamp.json"
    if stamp.exists():
        return out
    CACHE_ROOT.mkdir(parents=True, exist_ok=True)
    with (CACHE_ROOT / "kube.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if stamp.exists():
            return out
        partial = out.with_name(out.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        _build_binaries(version, partial)
        _build_images(partial)
        (partial / "stamp.json").write_text(json.dumps({
            "source": f"{SOURCE_PACKAGE} {version}",
            "reflect2": _installed_version("golang-github-modern-go-reflect2-dev"),
            "go": _installed_version("golang-1.19-go"),
        }, indent=1) + "\n")
        shutil.rmtree(out, ignore_errors=True)
        partial.rename(out)
        for old in CACHE_ROOT.glob("kube-*"):
            if old != out and old.is_dir():
                with contextlib.suppress(OSError):
                    shutil.rmtree(old)
    return out


def find() -> Path | None:
    """The built cache for the current inputs, or None (never builds, never installs)."""
    version = _source_version()
    if not version:
        return None
    out = CACHE_ROOT / f"kube-{cache_key(version)}"
    return out if (out / "stamp.json").exists() else None


if __name__ == "__main__":
    if sys.argv[1:] != ["build"]:
        raise SystemExit("usage: python tests/k8s/real/kube_cache.py build")
    print(build())
