"""``dlts render``: print the Kubernetes objects a job would produce, without a cluster.

For operators reviewing template changes and for people reviewing what a job body turns into. The
job body is validated exactly as ``POST /api/v1/jobs`` validates it; the objects (the NetworkPolicy
and the pods with everything they use) go through the same renderer, model checks and privilege
policy as ``KubernetesBackend.launch``, from the ``kubernetes:`` section of the configuration
(``dlts --config FILE render ...``).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import click

from dlts.backends.base import LaunchSpec
from dlts.backends.k8s_render import (
    LaunchRefused,
    ManifestRenderer,
    TemplateError,
    render_yaml,
)
from dlts.backends.k8s_settings import KubernetesSettings
from dlts.scheduler.model import Placement


def _load_body(path: str) -> dict:
    from marshmallow import ValidationError

    from dlts.schemas import JobSubmitSchema

    try:
        raw = json.loads(Path(path).read_text())
    except OSError as exc:
        raise click.ClickException(f"cannot read {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise click.ClickException(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise click.ClickException(f"{path} must hold a JSON object (a POST /api/v1/jobs body)")
    try:
        return dataclasses.asdict(req := JobSubmitSchema().load(raw)) | {"memory": req.memory_bytes}
    except ValidationError as exc:
        problems = "; ".join(f"{field}: {' '.join(map(str, msgs)) if isinstance(msgs, list) else msgs}"
                             for field, msgs in sorted(exc.normalized_messages().items()))
        raise click.ClickException(f"{path} is not a valid job: {problems}") from None


def build_spec(body: dict, *, user: str, nodes: list[str], job_id: int, attempt: int, cpu: float,
               memory_bytes: int, ssh_keys: tuple[str, ...] = (), uid: int | None = None, gid: int | None = None,
               groups: tuple[int, ...] = ()) -> LaunchSpec:
    """The ``LaunchSpec`` the job manager would hand the backend for ``body`` placed on ``nodes``."""
    job_type = body["type"]
    if job_type == "distributed":
        if body.get("nodes") and body["nodes"] != len(nodes):
            raise click.UsageError(f"the job asks for {body['nodes']} nodes; give exactly that many with --nodes")
    elif job_type != "inference" and len(nodes) != 1:
        raise click.UsageError(f"a {job_type} job runs on one node; give one with --nodes")
    gpus = int(body.get("gpus") or 0)
    per_node_cpu = float(body.get("cpu") or cpu)
    per_node_memory = int(body.get("memory") or memory_bytes)
    placements = tuple(Placement(node=n, gpu_indices=tuple(range(gpus)), cpu=per_node_cpu,
                                 memory_bytes=per_node_memory) for n in nodes)
    ports = tuple(body.get("ports") or ())
    return LaunchSpec(job_id=job_id, attempt=attempt, user=user, vc=body["vc"], type=job_type,
                      image=body["image"], command=body["command"], placements=placements,
                      env=dict(body.get("env") or {}), preemptible=bool(body.get("preemptible")), ports=ports,
                      ssh_public_keys=ssh_keys, uid=uid, gid=gid, supplemental_groups=groups,
                      run_as_root=bool(body.get("run_as_root")),
                      ephemeral_storage_bytes=body.get("ephemeral_storage_bytes"))


@click.command("render")
@click.option("--job", "job_file", required=True, type=click.Path(dir_okay=False),
              help="JSON file with a POST /api/v1/jobs body.")
@click.option("--user", required=True, help="The submitting user's name.")
@click.option("--nodes", required=True, help="Comma-separated node names the scheduler would choose.")
@click.option("--job-id", type=click.IntRange(1), default=1, show_default=True, help="Job id to name objects with.")
@click.option("--attempt", type=click.IntRange(1), default=1, show_default=True)
@click.option("--ssh-key-file", type=click.Path(exists=True, dir_okay=False), multiple=True,
              help="A public key file of the user (repeatable); goes into the endpoint ConfigMap's authorized_keys.")
@click.option("--cpu", type=click.FloatRange(min=0.001), default=None,
              help="Cores per node when the job sets none (default: cpu_job_default_cpu).")
@click.option("--memory-bytes", type=click.IntRange(1), default=None,
              help="Bytes per node when the job sets none (default: cpu_job_default_memory_bytes).")
@click.option("--uid", type=click.IntRange(0, 2**31 - 1), default=None,
              help="The user's uid (as `dlts user set USER --uid` records it); the pods run as it.")
@click.option("--gid", type=click.IntRange(0, 2**31 - 1), default=None, help="The user's gid (default: --uid).")
@click.option("--group", "groups", type=click.IntRange(0, 2**31 - 1), multiple=True,
              help="A supplementary group of the pods (the VC's gid; repeatable).")
@click.option("--namespace", default=None, help="Override the configured namespace.")
@click.option("--templates-dir", type=click.Path(file_okay=False), default=None,
              help="Override the configured templates directory.")
def render_command(job_file: str, user: str, nodes: str, job_id: int, attempt: int, ssh_key_file: tuple[str, ...],
                   cpu: float | None, memory_bytes: int | None, uid: int | None, gid: int | None,
                   groups: tuple[int, ...], namespace: str | None, templates_dir: str | None) -> None:
    """Print, as YAML documents, the Kubernetes objects a job would produce on NODES: the
    NetworkPolicy, the Services and the pods, from the kubernetes: section of the configuration."""
    config = click.get_current_context().find_root().obj.settings
    settings: KubernetesSettings = config.kubernetes
    if namespace:
        try:
            settings = KubernetesSettings.model_validate({**settings.model_dump(), "namespace": namespace})
        except ValueError as exc:
            raise click.BadParameter(str(exc).splitlines()[-1], param_hint="--namespace") from None
    templates = templates_dir or (str(config.templates_dir) if config.templates_dir else None)
    node_list = [n.strip() for n in nodes.split(",") if n.strip()]
    if not node_list:
        raise click.UsageError("--nodes needs at least one node name")
    keys = tuple(line.strip() for f in ssh_key_file for line in Path(f).read_text().splitlines() if line.strip())
    body = _load_body(job_file)
    spec = build_spec(body, user=user, nodes=node_list, job_id=job_id, attempt=attempt,
                      cpu=cpu or float(config.cpu_job_default_cpu),
                      memory_bytes=memory_bytes or int(config.cpu_job_default_memory_bytes),
                      ssh_keys=keys, uid=uid, gid=gid if gid is not None else uid, groups=tuple(groups))
    try:
        renderer = ManifestRenderer(settings, templates_dir=templates, termination_grace_s=config.preempt_grace_s)
        rendered = renderer.render(spec)
    except (LaunchRefused, TemplateError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(render_yaml(rendered.all()), nl=False)
