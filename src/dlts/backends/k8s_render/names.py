"""Names, labels and the endpoint line format of an attempt's Kubernetes objects.

Every object of attempt A of job J is named from ``dlts-J-A`` (pods ``dlts-J-A-<index>``, the pull
secret ``dlts-J-A-pull``, the endpoint ConfigMap ``dlts-J-A-endpoints``, the endpoint Service
``dlts-J-A-ep``, the NetworkPolicy ``dlts-J-A``) and carries the labels DLTS finds it by. Also the
two error types every part of the renderer raises.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable, Sequence

from dlts.backends.base import EndpointSpec

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "dlts"
LABEL_JOB_ID = "dlts.io/job-id"
LABEL_ATTEMPT = "dlts.io/attempt"
LABEL_VC = "dlts.io/vc"
LABEL_USER = "dlts.io/user"
LABEL_TYPE = "dlts.io/type"
LABEL_PREEMPTIBLE = "dlts.io/preemptible"
LABEL_ROLE = "dlts.io/role"
LABEL_INDEX = "dlts.io/index"
ANNOTATION_USER = "dlts.io/user"
ANNOTATION_VC = "dlts.io/vc"
ANNOTATION_WORLD_SIZE = "dlts.io/pods"
# Set on an inference replica's pod by scale-down before it is deleted: its ending is on purpose.
ANNOTATION_RETIRING = "dlts.io/retiring"
# The attempt's log key (dlts.logstore): the log copy writes each pod's output under the key of
# the attempt that made the pod
ANNOTATION_LOG_KEY = "dlts.io/log-key"
GPU_RESOURCE = "nvidia.com/gpu"
ENDPOINT_KINDS = frozenset({"ssh", "jupyter", "vscode", "port"})
MANAGED_SELECTOR = f"{MANAGED_BY_LABEL}={MANAGED_BY}"

_SECRET_HASH = re.compile(r"^[0-9a-f]{64}$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_SSH_KEY = re.compile(r"^(ssh-[a-z0-9-]+|ecdsa-sha2-[a-z0-9-]+|sk-[a-z0-9@.-]+) [A-Za-z0-9+/=]+( [^\r\n]*)?$")


class LaunchRefused(ValueError):
    """The job cannot be launched as asked (bad field, policy); retrying will not help."""


class TemplateError(RuntimeError):
    """Operator configuration is wrong: a template that does not render into a valid object, or a
    VC's pod policy / storage entry DLTS cannot use. Fix the configuration, not the job."""


def attempt_name(job_id: int, attempt: int) -> str:
    return f"dlts-{int(job_id)}-{int(attempt)}"


def pod_name(job_id: int, attempt: int, index: int) -> str:
    return f"{attempt_name(job_id, attempt)}-{int(index)}"


def pull_secret_name(job_id: int, attempt: int) -> str:
    return f"{attempt_name(job_id, attempt)}-pull"


def network_policy_name(job_id: int, attempt: int) -> str:
    return attempt_name(job_id, attempt)


def endpoint_service_name(job_id: int, attempt: int) -> str:
    return f"{attempt_name(job_id, attempt)}-ep"


def endpoint_configmap_name(job_id: int, attempt: int) -> str:
    return f"{attempt_name(job_id, attempt)}-endpoints"


def endpoint_port_name(endpoint_id: int) -> str:
    """The Service port of an endpoint (a DNS label, unique per job, stable across calls)."""
    return f"e{int(endpoint_id)}"


def label_value(text: str) -> str:
    """A valid label value for ``text``: itself when valid, else a readable, unique stand-in.

    User and VC names are free text to us (e-mail addresses, dots, unicode); labels are not.
    The exact value always travels in an annotation next to the label.
    """
    if len(text) <= 63 and _LABEL_VALUE.match(text):
        return text
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:10]
    cleaned = re.sub(r"[^A-Za-z0-9_.-]+", "-", text)[:50].strip("-_.")
    return f"{cleaned}-{digest}" if cleaned else digest


def attempt_match(job_id: int, attempt: int) -> dict[str, str]:
    """The labels that select exactly the pods of one attempt."""
    return {MANAGED_BY_LABEL: MANAGED_BY, LABEL_JOB_ID: str(int(job_id)), LABEL_ATTEMPT: str(int(attempt))}


def attempt_selector(job_id: int, attempt: int) -> str:
    return f"{MANAGED_BY_LABEL}={MANAGED_BY},{LABEL_JOB_ID}={int(job_id)},{LABEL_ATTEMPT}={int(attempt)}"


def endpoint_problem(endpoint: EndpointSpec) -> str | None:
    """Why ``endpoint`` cannot be exposed as given (None: it can). Rows are validated by the API;
    this keeps a bad row from breaking the line format the supervisor reads or opening an
    unprotected server."""
    if endpoint.kind not in ENDPOINT_KINDS:
        return f"unknown endpoint kind {endpoint.kind!r}; DLTS exposes {', '.join(sorted(ENDPOINT_KINDS))}"
    if isinstance(endpoint.port, bool) or not isinstance(endpoint.port, int) or not 1 <= endpoint.port <= 65535:
        return f"port {endpoint.port!r} is not a TCP port number (1-65535)"
    if endpoint.secret_hash and not _SECRET_HASH.match(endpoint.secret_hash):
        return "its token hash is not a SHA-256 hex digest; delete the endpoint and open it again"
    if endpoint.kind in ("jupyter", "vscode") and not endpoint.secret_hash:
        return f"a {endpoint.kind} endpoint needs a token (none recorded); delete the endpoint and open it again"
    return None


def endpoint_lines(endpoints: Sequence[EndpointSpec], container_port: Callable[[EndpointSpec], int]) -> str:
    """The ConfigMap's ``endpoints`` file: "ID KIND PORT [SECRET_SHA256]" per line, by id; PORT is where
    the server listens in the container (``container_port``)."""
    return "".join(" ".join([str(int(e.id)), e.kind, str(int(container_port(e)))]
                            + ([e.secret_hash] if e.secret_hash else []))
                   + "\n" for e in sorted(endpoints, key=lambda e: e.id))


def valid_ssh_key(key: str) -> bool:
    return bool(_SSH_KEY.match(key.strip()))


def authorized_keys(keys: Iterable[str]) -> str:
    return "".join(k.strip() + "\n" for k in keys)
