"""Turning a ``LaunchSpec`` into the Kubernetes objects of one attempt.

``names``: deterministic names, labels and the endpoint line format; ``scripts``: the init and
entrypoint commands that let a job start from any public image as its owner; ``policy``: what a
job may ask of its pods (checked on the spec and on the *rendered* pods, so a customised template
cannot grant what the cluster admin did not allow); ``renderer``: the templates and the objects of
an attempt. ``dlts render`` and the Kubernetes backend share it; it does no I/O besides reading
templates.
"""

from dlts.backends.k8s_render.names import (
    ANNOTATION_LOG_KEY,
    ANNOTATION_RETIRING,
    ANNOTATION_USER,
    ANNOTATION_VC,
    ANNOTATION_WORLD_SIZE,
    ENDPOINT_KINDS,
    GPU_RESOURCE,
    LABEL_ATTEMPT,
    LABEL_INDEX,
    LABEL_JOB_ID,
    LABEL_PREEMPTIBLE,
    LABEL_ROLE,
    LABEL_TYPE,
    LABEL_USER,
    LABEL_VC,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    MANAGED_SELECTOR,
    LaunchRefused,
    TemplateError,
    attempt_match,
    attempt_name,
    attempt_selector,
    authorized_keys,
    endpoint_configmap_name,
    endpoint_lines,
    endpoint_port_name,
    endpoint_problem,
    endpoint_service_name,
    label_value,
    network_policy_name,
    pod_name,
    pull_secret_name,
    valid_ssh_key,
)
from dlts.backends.k8s_render.policy import RESERVED_ENV, check_pod_policy, login_name
from dlts.backends.k8s_render.renderer import (
    DEFAULT_TEMPLATES_DIR,
    ENDPOINTS_DIR,
    SUPERVISOR_TEMPLATE,
    ManifestRenderer,
    RenderedAttempt,
    render_yaml,
    to_model,
    yaml_literal,
)
from dlts.backends.k8s_render.scripts import (
    BUSYBOX,
    ENTRYPOINT,
    IDENTITY_SCRIPT,
    INIT_COMMAND,
    RUNTIME_DIR,
)
from dlts.backends.k8s_settings import PrivilegedFeature

__all__ = [
    "ANNOTATION_LOG_KEY", "ANNOTATION_RETIRING", "ANNOTATION_USER", "ANNOTATION_VC", "ANNOTATION_WORLD_SIZE", "BUSYBOX",
    "DEFAULT_TEMPLATES_DIR", "ENDPOINTS_DIR", "ENDPOINT_KINDS", "ENTRYPOINT", "GPU_RESOURCE", "IDENTITY_SCRIPT",
    "INIT_COMMAND", "LABEL_ATTEMPT", "LABEL_INDEX", "LABEL_JOB_ID", "LABEL_PREEMPTIBLE", "LABEL_ROLE",
    "LABEL_TYPE", "LABEL_USER", "LABEL_VC", "MANAGED_BY", "MANAGED_BY_LABEL", "MANAGED_SELECTOR",
    "RESERVED_ENV", "RUNTIME_DIR", "SUPERVISOR_TEMPLATE", "LaunchRefused", "ManifestRenderer",
    "PrivilegedFeature", "RenderedAttempt", "TemplateError", "attempt_match", "attempt_name",
    "attempt_selector", "authorized_keys", "check_pod_policy", "endpoint_configmap_name", "endpoint_lines",
    "endpoint_port_name", "endpoint_problem", "endpoint_service_name", "label_value", "login_name",
    "network_policy_name", "pod_name", "pull_secret_name", "render_yaml", "to_model", "valid_ssh_key",
    "yaml_literal",
]
