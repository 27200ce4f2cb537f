"""Saved job specs ("templates"): personal ones, and ones shared with every member of a VC.

A template with ``vc_id`` NULL belongs to its author alone; one with a VC is visible to the VC's
members. Only the author or an admin of that VC may delete a shared template. The spec holds the
submit form's fields (never secrets beyond what the user typed into env vars themselves).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from dlts.errors import Forbidden, InvalidInput, NotFound
from dlts.models import JobTemplate, VirtualCluster
from dlts.services import policy
from dlts.services.auth import Principal
from dlts.services.transaction import transactional

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 _.-]{0,63}$")
SPEC_KEYS = ("vc", "name", "type", "image", "command", "gpus", "nodes", "sku", "cpu", "memory", "preemptible",
             "max_retries", "max_time_h", "priority", "env", "ssh", "ports")
MAX_SPEC_CHARS = 32 * 1024


def _vc_id(session: Session, name: str) -> int:
    vc_id = session.scalar(sa.select(VirtualCluster.id).where(VirtualCluster.name == name))
    if vc_id is None:
        raise NotFound(f"VC {name!r} does not exist.", code="vc_not_found", details={"field": "vc"})
    return vc_id


def visible_templates(session: Session, principal: Principal) -> list[tuple[JobTemplate, str | None]]:
    """(template, shared VC name or None) for the caller's own templates and those of their VCs."""
    query = (sa.select(JobTemplate, VirtualCluster.name)
             .outerjoin(VirtualCluster, VirtualCluster.id == JobTemplate.vc_id)
             .order_by(JobTemplate.name, JobTemplate.id))
    mine = sa.and_(JobTemplate.user_id == principal.user_id, JobTemplate.vc_id.is_(None))
    shared = VirtualCluster.name.in_(principal.vcs) if principal.vcs else sa.false()
    if principal.is_cluster_admin:
        shared = JobTemplate.vc_id.is_not(None)
    return [(t, vc) for t, vc in session.execute(query.where(sa.or_(mine, shared)))]


def get_template(session: Session, principal: Principal, template_id: int) -> JobTemplate:
    for template, _vc in visible_templates(session, principal):
        if template.id == template_id:
            return template
    raise NotFound(f"Template {template_id} does not exist or is not shared with you.", code="template_not_found")


@transactional
def save_template(session: Session, principal: Principal, name: str, spec: Mapping[str, Any],
                  share_with_vc: str | None = None) -> JobTemplate:
    """Create or overwrite the caller's template ``name`` (personal, or shared with a VC they belong to)."""
    name = name.strip()
    if not NAME_RE.match(name):
        raise InvalidInput("A template name has 1-64 letters, digits, spaces, '.', '_' or '-'.",
                           code="invalid_template_name", details={"field": "template_name"})
    clean = {k: spec[k] for k in SPEC_KEYS if k in spec}
    if len(repr(clean)) > MAX_SPEC_CHARS:
        raise InvalidInput("This job spec is too large to save as a template.", details={"field": "template_name"})
    vc_id = None
    if share_with_vc:
        policy.require_vc_member(principal, share_with_vc)
        vc_id = _vc_id(session, share_with_vc)
    existing = session.scalar(sa.select(JobTemplate).where(
        JobTemplate.user_id == principal.user_id, JobTemplate.name == name,
        JobTemplate.vc_id.is_(None) if vc_id is None else JobTemplate.vc_id == vc_id))
    if existing is not None:
        existing.spec = clean
        template = existing
    else:
        template = JobTemplate(user_id=principal.user_id, vc_id=vc_id, name=name, spec=clean)
        session.add(template)
    return template


@transactional
def delete_template(session: Session, principal: Principal, template_id: int) -> None:
    template = get_template(session, principal, template_id)
    if template.user_id != principal.user_id:
        vc_name = session.scalar(sa.select(VirtualCluster.name).where(VirtualCluster.id == template.vc_id))
        if vc_name is None or not principal.is_vc_admin(vc_name):
            raise Forbidden(f"Only the template's author or an admin of VC {vc_name} may delete it.")
    session.delete(template)

