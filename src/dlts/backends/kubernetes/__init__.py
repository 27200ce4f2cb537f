"""The Kubernetes cluster backend: job attempts as pods, through the official ``kubernetes`` client.

One module per concern:

* ``names``: the names and labels the backend finds, reads and deletes objects by;
* ``api``: every request: credentials, back-off, paged lists (``limit``/``continue``), pod logs;
* ``translate``: pods to ``Observed`` (pure; waiting reasons), with ``dlts.backends.phases``,
  the replica-phase rule the local backend shares;
* ``endpoints``: ``expose`` (NodePort Service and the endpoint ConfigMap);
* ``logcopy``: the pods' output copied into the log store;
* ``nodes``: node sync, lost nodes, cordons;
* ``backend``: ``KubernetesBackend``, which puts them together.

The settings are the ``kubernetes:`` section of the configuration
(``dlts.backends.k8s_settings.KubernetesSettings``).
"""

from dlts.backends.k8s_render import LaunchRefused, TemplateError
from dlts.backends.k8s_settings import KubernetesSettings, PrivilegedFeature
from dlts.backends.kubernetes.api import KubernetesRefused, KubernetesUnavailable
from dlts.backends.kubernetes.backend import KubernetesBackend
from dlts.backends.kubernetes.nodes import CordonResult, NodeNotFound

__all__ = [
    "CordonResult", "KubernetesBackend", "KubernetesRefused", "KubernetesSettings", "KubernetesUnavailable", "LaunchRefused",
    "NodeNotFound", "PrivilegedFeature", "TemplateError",
]
