"""A real Kubernetes on this machine for the tests: control plane, one node, torn down without leftovers.

``RealCluster`` starts, from the binaries ``kube_cache.py`` builds and Debian's packages:

* etcd on random loopback ports, its data on tmpfs (``/dev/shm``);
* kube-apiserver (secure port only, RBAC and Node authorisation, fresh certificates), the
  controller manager and the scheduler (their own ports off: fixed defaults clash between runs);
* per node (two by default: ``dlts-kube-0`` and ``dlts-kube-1``): a containerd with its own config,
  root, state and socket, the three cached images imported (no pod ever pulls), the bridge +
  host-local CNI on a bridge and pod subnet of its own (``dlts-kt<i>``, 10.244.<77+i>.0/24), and a
  kubelet on the host's non-loopback address with its own directory and cgroup root (the cgroupfs
  driver; a kubelet removes the pod cgroups it does not know under its root), eviction and image GC
  effectively off (local-only images must never be collected).

Everything gets fresh ECDSA certificates from one CA per run. A piece that does not start raises
``ClusterDidNotStart`` naming it, with the tail of its log. ``stop()`` deletes every pod through the
API and waits for their sandboxes' network namespaces to go before it stops the kubelet (otherwise
the CNI teardown never runs), ends containerd's shims by PID (those whose command line names this
run's socket), unmounts what is left under the run's directories, deletes the bridges, the nodes'
cgroup roots and the CNI results, and ``leftovers()`` says what, if anything, is still there.

``python -m tests.k8s.real.cluster`` (from the checkout) starts one, prints how to reach it, and stops it on Enter.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import ipaddress
import json
import os
import re
import shlex
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.k8s.real import kube_cache

NODE_NAME = "dlts-kube-0"  # the first node; node i is dlts-kube-<i>
SERVICE_RANGE = "10.0.0.0/24"
CNI_NETWORK = "dlts-kube-test"
CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass
class NodeHost:
    """One node of the cluster on this host: its own containerd, bridge, pod subnet, kubelet
    directory and cgroup root, so that several kubelets share the host without touching each
    other's pods (a kubelet removes pod cgroups it does not know under its root)."""

    index: int
    base: Path

    @property
    def name(self) -> str:
        return f"dlts-kube-{self.index}"

    @property
    def bridge(self) -> str:
        return f"dlts-kt{self.index}"

    @property
    def subnet(self) -> str:
        return f"10.244.{77 + self.index}.0/24"

    @property
    def directory(self) -> Path:
        return self.base / self.name

    @property
    def socket(self) -> Path:
        return self.directory / "containerd/containerd.sock"

    @property
    def cgroup_root(self) -> str:
        return f"/{self.name}-{self.base.name.rsplit('.', 1)[-1]}"

    @property
    def ipam(self) -> Path:
        return self.directory / "cni/ipam"

    def leases(self) -> list[Path]:
        """The pod addresses host-local still has out: one file per address, released by CNI DEL."""
        return [p for p in self.ipam.glob("*/*") if re.fullmatch(r"[0-9.]+", p.name)]


class ClusterDidNotStart(RuntimeError):
    """A piece of the cluster did not come up; the message names it and quotes its log."""


def host_ip() -> str:
    """The host's first non-loopback IPv4 (the node's InternalIP and the API server's advertise address)."""
    out = subprocess.run(["ip", "-4", "-o", "addr", "show", "scope", "global"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        match = re.search(r"inet (\d+\.\d+\.\d+\.\d+)/", line)
        if match:
            return match.group(1)
    raise ClusterDidNotStart("no non-loopback IPv4 address on this host for the node and the API server")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(what: str, check: Callable[[], object], timeout_s: float, *, log: Path | None = None,
             proc: subprocess.Popen[bytes] | None = None) -> Any:
    """Poll ``check`` until it returns something truthy; ClusterDidNotStart with the log's tail otherwise."""
    deadline = time.monotonic() + timeout_s
    last_error = ""
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise ClusterDidNotStart(f"{what}: the process exited with {proc.returncode}" + _tail(log))
        try:
            result = check()
            if result:
                return result
        except Exception as exc:  # noqa: BLE001 - any failure of a probe means "not yet"
            last_error = f"{type(exc).__name__}: {exc}"
        time.sleep(0.2)
    raise ClusterDidNotStart(f"{what}: not ready after {timeout_s:g} s"
                             + (f" (last probe: {last_error})" if last_error else "") + _tail(log))


def _tail(log: Path | None, lines: int = 25) -> str:
    if log is None or not log.exists():
        return ""
    text = log.read_text(errors="replace").splitlines()[-lines:]
    return f"\n--- last lines of {log} ---\n" + "\n".join(text)


# -- certificates ----------------------------------------------------------------------------------

@dataclass
class Pki:
    directory: Path
    ca_key: ec.EllipticCurvePrivateKey = field(init=False)
    ca_cert: x509.Certificate = field(init=False)

    def __post_init__(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.ca_key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "dlts-test-ca")])
        now = dt.datetime.now(dt.UTC)
        self.ca_cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
                        .public_key(self.ca_key.public_key()).serial_number(x509.random_serial_number())
                        .not_valid_before(now - dt.timedelta(hours=1)).not_valid_after(now + dt.timedelta(days=2))
                        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                        .add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False, False),
                                       critical=True)
                        .sign(self.ca_key, hashes.SHA256()))
        self._write("ca", self.ca_key, self.ca_cert)

    @property
    def ca(self) -> Path:
        return self.directory / "ca.crt"

    def issue(self, stem: str, common_name: str, *, orgs: tuple[str, ...] = (), dns: tuple[str, ...] = (),
              ips: tuple[str, ...] = (), server: bool = False) -> tuple[Path, Path]:
        key = ec.generate_private_key(ec.SECP256R1())
        attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs]
        attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
        now = dt.datetime.now(dt.UTC)
        builder = (x509.CertificateBuilder().subject_name(x509.Name(attrs)).issuer_name(self.ca_cert.subject)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - dt.timedelta(hours=1)).not_valid_after(now + dt.timedelta(days=1))
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                   .add_extension(x509.ExtendedKeyUsage(
                       [x509.ExtendedKeyUsageOID.SERVER_AUTH if server else x509.ExtendedKeyUsageOID.CLIENT_AUTH]),
                       critical=False))
        names: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
        names += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(self.ca_key, hashes.SHA256())
        return self._write(stem, key, cert)

    def key_pair(self, stem: str) -> tuple[Path, Path]:
        """A bare key pair (the service accounts' signing key): ``stem.key`` and ``stem.pub``."""
        key = ec.generate_private_key(ec.SECP256R1())
        private = self.directory / f"{stem}.key"
        public = self.directory / f"{stem}.pub"
        private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                              serialization.NoEncryption()))
        public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                         serialization.PublicFormat.SubjectPublicKeyInfo))
        private.chmod(0o600)
        return private, public

    def _write(self, stem: str, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> tuple[Path, Path]:
        crt, pem = self.directory / f"{stem}.crt", self.directory / f"{stem}.key"
        crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        pem.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                                          serialization.NoEncryption()))
        pem.chmod(0o600)
        return crt, pem


def write_kubeconfig(path: Path, server: str, ca: Path, cert: Path, key: Path, user: str = "admin") -> Path:
    doc = {
        "apiVersion": "v1", "kind": "Config", "current-context": "dlts-test",
        "clusters": [{"name": "dlts-test", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": user, "user": {"client-certificate": str(cert), "client-key": str(key)}}],
        "contexts": [{"name": "dlts-test", "context": {"cluster": "dlts-test", "user": user}}],
    }
    path.write_text(json.dumps(doc, indent=1))  # JSON is YAML
    path.chmod(0o600)
    return path


# -- the cluster -----------------------------------------------------------------------------------

class RealCluster:
    """One control plane and ``nodes`` nodes. Use as a context manager, or ``start()`` / ``stop()``."""

    def __init__(self, cache: Path, *, gpus: int = 8, sku: str = "a100", nodes: int = 2) -> None:
        self.cache = cache
        self.gpus, self.sku = gpus, sku
        self.images: dict[str, str] = json.loads((cache / "images/names.json").read_text())
        self.base = Path(tempfile.mkdtemp(prefix="dlts-kube.", dir="/var/tmp"))
        self.shm = Path(tempfile.mkdtemp(prefix="dlts-kube-etcd.", dir="/dev/shm"))
        self.logs = self.base / "logs"
        self.logs.mkdir()
        self.ip = host_ip()
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.server = ""
        self.admin_kubeconfig = self.base / "admin.kubeconfig"
        self.nodes = [NodeHost(i, self.base) for i in range(nodes)]
        self._kubelet_argv: dict[str, list[str]] = {}
        self._ports: dict[str, int] = {}
        self._ssl: ssl.SSLContext | None = None
        self.started_s = 0.0

    def __enter__(self) -> RealCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- start ---------------------------------------------------------------------------------

    def start(self) -> None:
        t0 = time.monotonic()
        self._check_host()
        self.pki = Pki(self.base / "pki")
        self._certificates()
        for node in self.nodes:  # their start and the image import overlap the control plane's
            self._start_containerd(node)
        self._start_etcd()
        self._start_apiserver()
        self._start_controllers()
        for node in self.nodes:
            self._import_images(node)
            self._start_kubelet(node)
        for node in self.nodes:
            self.wait_node_ready(node.name)
            self.advertise_gpus(node.name)
        wait_for("the default ServiceAccount (controller manager)",
                 lambda: self.request("GET", "/api/v1/namespaces/default/serviceaccounts/default"),
                 60, log=self.logs / "kube-controller-manager.log")
        self.started_s = time.monotonic() - t0

    def _check_host(self) -> None:
        if os.geteuid() != 0:
            raise ClusterDidNotStart("a real kubelet and containerd need root")
        for tool in ("etcd", "containerd", "containerd-shim-runc-v2", "runc", "ctr", "iptables", "ip", "unshare",
                     "nsenter"):
            if shutil.which(tool) is None:
                raise ClusterDidNotStart(f"{tool} is not installed: run `python tests/k8s/real/kube_cache.py build`")
        if not Path("/usr/lib/cni/bridge").exists():
            raise ClusterDidNotStart("the CNI plugins are not installed (containernetworking-plugins)")
        for node in self.nodes:
            if subprocess.run(["ip", "link", "show", node.bridge], capture_output=True).returncode == 0:
                raise ClusterDidNotStart(f"bridge {node.bridge} exists: another real cluster runs here, or one was "
                                         f"not torn down (`ip link del {node.bridge}`)")

    def _certificates(self) -> None:
        p = self.pki
        self.apiserver_cert = p.issue("apiserver", "kube-apiserver", server=True, ips=("127.0.0.1", "10.0.0.1", self.ip),
                                      dns=("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
                                           "kubernetes.default.svc.cluster.local"))
        self.admin_cert = p.issue("admin", "dlts-test-admin", orgs=("system:masters",))
        self.apiserver_kubelet = p.issue("apiserver-kubelet", "kube-apiserver-kubelet-client", orgs=("system:masters",))
        self.cm_cert = p.issue("controller-manager", "system:kube-controller-manager")
        self.sched_cert = p.issue("scheduler", "system:kube-scheduler")
        self.node_certs = {n.name: p.issue(f"node-{n.index}", f"system:node:{n.name}", orgs=("system:nodes",))
                           for n in self.nodes}
        self.kubelet_serving = {n.name: p.issue(f"kubelet-serving-{n.index}", n.name, server=True,
                                                ips=(self.ip, "127.0.0.1"), dns=(n.name, "localhost"))
                                for n in self.nodes}
        self.sa_key, self.sa_pub = p.key_pair("service-accounts")

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        log = (self.logs / f"{name}.log").open("wb")
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env or dict(os.environ), start_new_session=True)
        log.close()
        self.procs[name] = proc
        return proc

    def _start_etcd(self) -> None:
        client, peer = free_port(), free_port()
        self._ports["etcd"] = client
        proc = self._spawn("etcd", [
            "etcd", "--name", "dlts-test", "--data-dir", str(self.shm / "etcd"),
            "--listen-client-urls", f"http://127.0.0.1:{client}", "--advertise-client-urls", f"http://127.0.0.1:{client}",
            "--listen-peer-urls", f"http://127.0.0.1:{peer}", "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-cluster", f"dlts-test=http://127.0.0.1:{peer}", "--listen-metrics-urls", "",
            "--log-level", "warn", "--logger", "zap",
        ])
        wait_for("etcd", lambda: b"true" in urllib.request.urlopen(f"http://127.0.0.1:{client}/health", timeout=2).read(),
                 30, log=self.logs / "etcd.log", proc=proc)

    def _start_apiserver(self) -> None:
        port = free_port()
        self._ports["apiserver"] = port
        self.server = f"https://127.0.0.1:{port}"
        crt, key = self.apiserver_cert
        kcrt, kkey = self.apiserver_kubelet
        proc = self._spawn("kube-apiserver", [
            str(self.cache / "bin/kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{self._ports['etcd']}", f"--secure-port={port}", "--insecure-port=0",
            "--bind-address=127.0.0.1", f"--advertise-address={self.ip}",
            f"--client-ca-file={self.pki.ca}", f"--tls-cert-file={crt}", f"--tls-private-key-file={key}",
            f"--service-cluster-ip-range={SERVICE_RANGE}", "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={self.sa_pub}", f"--service-account-signing-key-file={self.sa_key}",
            "--authorization-mode=Node,RBAC", f"--kubelet-client-certificate={kcrt}", f"--kubelet-client-key={kkey}",
            f"--kubelet-certificate-authority={self.pki.ca}",
            "--kubelet-preferred-address-types=InternalIP,Hostname", "--allow-privileged=true",
            "--enable-priority-and-fairness=false", "--profiling=false", "--v=1",
        ])
        self.admin_kubeconfig = write_kubeconfig(self.base / "admin.kubeconfig", self.server, self.pki.ca,
                                                 *self.admin_cert)
        wait_for("kube-apiserver /readyz", lambda: self.request("GET", "/readyz", raw=True) == b"ok", 60,
                 log=self.logs / "kube-apiserver.log", proc=proc)

    def _start_controllers(self) -> None:
        cm_kc = write_kubeconfig(self.base / "controller-manager.kubeconfig", self.server, self.pki.ca, *self.cm_cert,
                                 user="system:kube-controller-manager")
        sched_kc = write_kubeconfig(self.base / "scheduler.kubeconfig", self.server, self.pki.ca, *self.sched_cert,
                                    user="system:kube-scheduler")
        self._spawn("kube-controller-manager", [
            str(self.cache / "bin/kube-controller-manager"), f"--kubeconfig={cm_kc}",
            f"--service-account-private-key-file={self.sa_key}", f"--root-ca-file={self.pki.ca}",
            "--use-service-account-credentials", "--port=0", "--secure-port=0", "--leader-elect=false",
            f"--service-cluster-ip-range={SERVICE_RANGE}", "--profiling=false", "--v=1",
            # a lost node's pods are marked for deletion quickly (the node-loss test stops the kubelet)
            "--node-monitor-grace-period=16s", "--pod-eviction-timeout=20s",
        ])
        self._spawn("kube-scheduler", [
            str(self.cache / "bin/kube-scheduler"), f"--kubeconfig={sched_kc}", "--port=0", "--secure-port=0",
            "--leader-elect=false", "--profiling=false", "--v=1",
        ])

    def _start_containerd(self, node: NodeHost) -> None:
        root = node.directory / "containerd"
        cni_conf = node.directory / "cni/net.d"
        cni_conf.mkdir(parents=True)
        (cni_conf / "10-dlts.conflist").write_text(json.dumps({
            "cniVersion": "0.4.0", "name": CNI_NETWORK,
            "plugins": [{"type": "bridge", "bridge": node.bridge, "isGateway": True, "ipMasq": False,
                         "ipam": {"type": "host-local", "ranges": [[{"subnet": node.subnet}]],
                                  "routes": [{"dst": "0.0.0.0/0"}], "dataDir": str(node.ipam)}}],
        }))
        config = root / "config.toml"
        root.mkdir(exist_ok=True)
        config.write_text(f"""version = 2
root = "{root}/root"
state = "{root}/state"
[grpc]
  address = "{node.socket}"
[ttrpc]
  address = "{node.socket}.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "{root}/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{self.images['pause']}"
  restrict_oom_score_adj = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{cni_conf}"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
""")
        # Each node's containerd and kubelet share a mount namespace of their own, where /var/log/pods is
        # the node's: a kubelet deletes the pod log directories of pods it does not know (its container
        # GC), which on a shared /var/log/pods are the other node's pods' logs. The mounts the kubelet
        # makes (secret volumes) stay in that namespace and go with it.
        pod_logs = node.directory / "var-log-pods"
        pod_logs.mkdir()
        Path("/var/log/pods").mkdir(parents=True, exist_ok=True)
        command = (f"mount --bind {shlex.quote(str(pod_logs))} /var/log/pods && exec containerd --config "
                   f"{shlex.quote(str(config))} --log-level warn")
        self._spawn(f"containerd-{node.index}", ["unshare", "--mount", "--propagation", "private", "--",
                                                 "sh", "-c", command])

    def _ctr(self, node: NodeHost, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["ctr", "--address", str(node.socket), "--namespace", "k8s.io", *args],
                              capture_output=True, text=True, timeout=120)

    def _import_images(self, node: NodeHost) -> None:
        wait_for(f"containerd of {node.name}", lambda: self._ctr(node, "version").returncode == 0, 30,
                 log=self.logs / f"containerd-{node.index}.log", proc=self.procs[f"containerd-{node.index}"])
        for tarball in ("pause", "init", "shell"):
            done = self._ctr(node, "images", "import", "--no-unpack", str(self.cache / "images" / f"{tarball}.tar"))
            if done.returncode:
                raise ClusterDidNotStart(f"importing image {tarball}.tar into containerd failed: {done.stderr.strip()}")

    def _cgroup_dirs(self, node: NodeHost) -> list[Path]:
        """The node's cgroup root in every cgroup v1 hierarchy (named ones included)."""
        hierarchies = [h for h in CGROUP_ROOT.iterdir() if h.is_dir() and not h.is_symlink()]
        return [h / node.cgroup_root.lstrip("/") for h in hierarchies]

    def _start_kubelet(self, node: NodeHost) -> None:
        port = free_port()
        kubelet_dir = node.directory / "kubelet"
        kubelet_dir.mkdir()
        for directory in self._cgroup_dirs(node):  # the kubelet requires its cgroup root to exist
            directory.mkdir(exist_ok=True)
        crt, key = self.kubelet_serving[node.name]
        config = kubelet_dir / "config.yaml"
        config.write_text(json.dumps({
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "address": self.ip, "port": port, "readOnlyPort": 0, "healthzPort": 0,
            "cgroupDriver": "cgroupfs", "cgroupRoot": node.cgroup_root, "failSwapOn": False,
            "authentication": {"x509": {"clientCAFile": str(self.pki.ca)}, "webhook": {"enabled": False},
                               "anonymous": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            "tlsCertFile": str(crt), "tlsPrivateKeyFile": str(key),
            "evictionHard": {"memory.available": "1Mi", "nodefs.available": "0%", "nodefs.inodesFree": "0%",
                             "imagefs.available": "0%"},
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            "nodeStatusUpdateFrequency": "4s", "nodeStatusReportFrequency": "4s",
            "syncFrequency": "5s", "fileCheckFrequency": "60s", "httpCheckFrequency": "60s",
            "clusterDomain": "cluster.local", "resolvConf": "/etc/resolv.conf",
            "serializeImagePulls": False, "maxPods": 250,
            # no KUBE-FIREWALL / KUBE-MARK-* chains in the host's iptables (kube-proxy is not run here)
            "makeIPTablesUtilChains": False,
            "containerLogMaxSize": "10Mi", "containerLogMaxFiles": 2,
        }))
        kubeconfig = write_kubeconfig(kubelet_dir / "kubeconfig", self.server, self.pki.ca, *self.node_certs[node.name],
                                      user=node.name)
        namespace = f"--target={self.procs[f'containerd-{node.index}'].pid}"  # the node's mount namespace
        self._kubelet_argv[node.name] = [
            "nsenter", namespace, "--mount", "--",
            str(self.cache / "bin/kubelet"), f"--config={config}", f"--kubeconfig={kubeconfig}",
            "--container-runtime=remote", f"--container-runtime-endpoint=unix://{node.socket}",
            f"--node-ip={self.ip}", f"--hostname-override={node.name}", f"--root-dir={kubelet_dir / 'root'}",
            f"--cert-dir={kubelet_dir / 'pki'}", f"--node-labels=dlts.io/sku={self.sku}", "--v=1",
        ]
        self._spawn(f"kubelet-{node.index}", self._kubelet_argv[node.name])

    def node(self, name: str) -> NodeHost:
        return next(n for n in self.nodes if n.name == name)

    def wait_node_ready(self, name: str = NODE_NAME, timeout_s: float = 90) -> None:
        index = self.node(name).index
        wait_for(f"node {name} Ready (kubelet)", lambda: self.node_ready(name), timeout_s,
                 log=self.logs / f"kubelet-{index}.log", proc=self.procs.get(f"kubelet-{index}"))

    def node_ready(self, name: str = NODE_NAME) -> bool:
        node = self.request("GET", f"/api/v1/nodes/{name}")
        if node is None:
            return False
        return any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"].get("conditions") or [])

    def advertise_gpus(self, name: str) -> None:
        """Fake GPUs for scheduling: the node's capacity of ``nvidia.com/gpu`` (extended resources are
        advertised by patching the node's status, as a device plugin's registration ends up doing)."""
        patch = [{"op": "add", "path": "/status/capacity/nvidia.com~1gpu", "value": str(self.gpus)}]
        self.request("PATCH", f"/api/v1/nodes/{name}/status", body=patch,
                     content_type="application/json-patch+json")
        wait_for(f"the allocatable GPUs of {name}", lambda: (self.request("GET", f"/api/v1/nodes/{name}") or {})
                 .get("status", {}).get("allocatable", {}).get("nvidia.com/gpu") == str(self.gpus), 30)

    # -- node loss ----------------------------------------------------------------------------------

    def stop_kubelet(self, name: str = NODE_NAME) -> None:
        """The node is lost: its kubelet stops (its pods' containers keep running, as on a real loss)."""
        proc = self.procs.pop(f"kubelet-{self.node(name).index}", None)
        if proc is not None:
            _end(proc)

    def start_kubelet(self, name: str = NODE_NAME) -> None:
        key = f"kubelet-{self.node(name).index}"
        if key not in self.procs:
            self._spawn(key, self._kubelet_argv[name])

    # -- talking to it ------------------------------------------------------------------------------

    def ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            ctx = ssl.create_default_context(cafile=str(self.pki.ca))
            ctx.load_cert_chain(*self.admin_cert)
            self._ssl = ctx
        return self._ssl

    def request(self, method: str, path: str, *, body: Any = None, raw: bool = False,
                content_type: str = "application/json") -> Any:
        """One admin request; None for 404; the parsed JSON (or bytes with ``raw``)."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.server + path, data=data, method=method,
                                     headers={"Content-Type": content_type, "Accept": "application/json, */*"})
        try:
            with urllib.request.urlopen(req, context=self.ssl_context(), timeout=10) as resp:
                payload = resp.read()
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise
        return payload if raw else json.loads(payload)

    def apply(self, doc: dict[str, Any]) -> dict[str, Any]:
        """Create one object (cluster-scoped or namespaced) as the admin."""
        kind_paths = {"Namespace": "/api/v1/namespaces", "PriorityClass": "/apis/scheduling.k8s.io/v1/priorityclasses",
                      "ClusterRole": "/apis/rbac.authorization.k8s.io/v1/clusterroles",
                      "ClusterRoleBinding": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings"}
        ns = doc["metadata"].get("namespace")
        namespaced = {"Role": f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
                      "RoleBinding": f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings",
                      "ServiceAccount": f"/api/v1/namespaces/{ns}/serviceaccounts",
                      "Secret": f"/api/v1/namespaces/{ns}/secrets"}
        path = kind_paths.get(doc["kind"]) or namespaced[doc["kind"]]
        return self.request("POST", path, body=doc)  # type: ignore[no-any-return]

    def exec_in(self, namespace: str, pod: str, container: str, command: list[str]) -> str:
        """Run ``command`` in a running container (pods/exec through the API server to the kubelet's
        streaming server and containerd's); its output."""
        from kubernetes import client, config
        from kubernetes.stream import stream

        api = client.CoreV1Api(config.new_client_from_config(str(self.admin_kubeconfig)))
        try:
            return str(stream(api.connect_get_namespaced_pod_exec, pod, namespace, container=container,
                              command=command, stderr=True, stdin=False, stdout=True, tty=False))
        finally:
            api.api_client.close()

    def pods(self, namespace: str | None = None) -> list[dict[str, Any]]:
        path = f"/api/v1/namespaces/{namespace}/pods" if namespace else "/api/v1/pods"
        return list(self.request("GET", path)["items"])

    # -- stop ---------------------------------------------------------------------------------------

    def stop(self) -> None:
        """Tear down without leftovers (see the module's docstring); safe to call twice."""
        if self.procs.get("kube-apiserver") is not None and self.procs["kube-apiserver"].poll() is None:
            for node in self.nodes:
                lost = node.name in self._kubelet_argv and f"kubelet-{node.index}" not in self.procs
                if lost and self.procs.get(f"containerd-{node.index}") is not None:
                    self.start_kubelet(node.name)  # a node lost by a test comes back to tear its pods down
            self._drain_pods()
        for name in [f"kubelet-{n.index}" for n in self.nodes] + ["kube-scheduler", "kube-controller-manager"]:
            proc = self.procs.pop(name, None)
            if proc is not None:
                _end(proc)
        for node in self.nodes:
            self._remove_sandboxes(node)
        for name in [f"containerd-{n.index}" for n in self.nodes] + ["kube-apiserver", "etcd"]:
            proc = self.procs.pop(name, None)
            if proc is not None:
                _end(proc)
        for node in self.nodes:
            self._end_shims(node)
        self._unmount_under(self.base)
        for node in self.nodes:
            subprocess.run(["ip", "link", "del", node.bridge], capture_output=True)
            for directory in self._cgroup_dirs(node):
                _remove_cgroup(directory)
        for path in Path("/var/lib/cni/results").glob(f"{CNI_NETWORK}-*"):
            path.unlink(missing_ok=True)
        shutil.rmtree(self.shm, ignore_errors=True)
        if os.environ.get("DLTS_KUBE_KEEP_LOGS"):
            shutil.copytree(self.logs, os.environ["DLTS_KUBE_KEEP_LOGS"], dirs_exist_ok=True)
        shutil.rmtree(self.base, ignore_errors=True)

    def _drain_pods(self) -> None:
        """Delete every pod now and wait until the kubelets have torn their sandboxes down (CNI DEL)."""
        with contextlib.suppress(Exception):
            for pod in self.pods():
                meta = pod["metadata"]
                self.request("DELETE", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                             body={"gracePeriodSeconds": 0})
        with contextlib.suppress(ClusterDidNotStart):
            wait_for("the pods' sandboxes to be torn down (CNI DEL)",
                     lambda: not any(node.leases() for node in self.nodes), 60)

    def _sandboxes(self, node: NodeHost) -> list[str]:
        if not node.socket.exists():
            return []
        return self._ctr(node, "containers", "list", "-q").stdout.split()

    def _remove_sandboxes(self, node: NodeHost) -> None:
        """What the kubelet did not tear down (it did not drain in time): the tasks killed, and every
        network namespace holding an address of the node's pod subnet deleted (its veth with it)."""
        if not node.leases() or self.procs.get(f"containerd-{node.index}") is None:
            return
        for cid in self._sandboxes(node):
            self._ctr(node, "tasks", "kill", "-s", "SIGKILL", cid)
        subnet = ipaddress.ip_network(node.subnet)
        for netns in Path("/run/netns").glob("cni-*"):
            out = subprocess.run(["ip", "netns", "exec", netns.name, "ip", "-4", "-o", "addr"], capture_output=True,
                                 text=True).stdout
            addresses = re.findall(r"inet (\d+\.\d+\.\d+\.\d+)/", out)
            if any(ipaddress.ip_address(a) in subnet for a in addresses):
                subprocess.run(["ip", "netns", "del", netns.name], capture_output=True)

    def _end_shims(self, node: NodeHost) -> None:
        marker = str(node.socket).encode()
        for proc_dir in Path("/proc").iterdir():
            if not proc_dir.name.isdigit():
                continue
            try:
                cmdline = (proc_dir / "cmdline").read_bytes()
            except OSError:
                continue
            if b"containerd-shim" in cmdline and marker in cmdline:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(proc_dir.name), signal.SIGKILL)

    @staticmethod
    def _unmount_under(base: Path) -> None:
        mounts = []
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            point = line.split()[4].replace("\\040", " ")
            if point == str(base) or point.startswith(f"{base}/"):
                mounts.append(point)
        for point in sorted(mounts, key=len, reverse=True):
            subprocess.run(["umount", "-l", point], capture_output=True)

    def leftovers(self) -> list[str]:
        """What this run left behind on the host (empty when the teardown was clean)."""
        found = []
        for node in self.nodes:
            if subprocess.run(["ip", "link", "show", node.bridge], capture_output=True).returncode == 0:
                found.append(f"bridge {node.bridge}")
            links = subprocess.run(["ip", "-o", "link", "show", "master", node.bridge], capture_output=True,
                                   text=True).stdout
            found += [f"veth {line.split(':')[1].strip()}" for line in links.splitlines() if line.strip()]
            found += [f"cgroup {d}" for d in self._cgroup_dirs(node) if d.exists()]
            found += [f"address lease {p.name}" for p in node.leases()]
        for table in ("filter", "nat"):
            rules = subprocess.run(["iptables-save", "-t", table], capture_output=True, text=True).stdout
            found += [f"iptables -t {table} {line}" for line in rules.splitlines()
                      if CNI_NETWORK in line or line.startswith((":KUBE-", ":CNI-"))]
        found += [f"results {p}" for p in Path("/var/lib/cni/results").glob(f"{CNI_NETWORK}-*")]
        for proc_dir in Path("/proc").iterdir():
            if proc_dir.name.isdigit():
                with contextlib.suppress(OSError):
                    cmdline = (proc_dir / "cmdline").read_bytes()
                    if str(self.base).encode() in cmdline or str(self.shm).encode() in cmdline:
                        shown = cmdline.replace(b"\0", b" ")[:120].decode(errors="replace")
                        found.append(f"process {proc_dir.name}: {shown}")
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            point = line.split()[4]
            if point.startswith(str(self.base)):
                found.append(f"mount {point}")
        if self.base.exists():
            found.append(f"directory {self.base}")
        return found


def _remove_cgroup(directory: Path) -> None:
    """rmdir a cgroup and the cgroups under it, deepest first (a cgroup directory holds only files the
    kernel removes with it, so rmdir is the way to delete it)."""
    if not directory.exists():
        return
    for path in sorted((p for p in directory.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):
            path.rmdir()
    with contextlib.suppress(OSError):
        directory.rmdir()


def _end(proc: subprocess.Popen[bytes], timeout_s: float = 15) -> None:
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def main() -> None:
    cache = kube_cache.find()
    if cache is None:
        raise SystemExit("no built cache: run `python tests/k8s/real/kube_cache.py build` first")
    with RealCluster(cache) as cluster:
        print(f"up in {cluster.started_s:.1f} s: KUBECONFIG={cluster.admin_kubeconfig}; logs in {cluster.logs}")
        with contextlib.suppress(EOFError):
            input("Enter stops it ")
    print("left behind:", cluster.leftovers() or "nothing")


if __name__ == "__main__":
    main()
