"""The web portal: server-rendered pages over the same services as the REST API.

``init_portal(app)`` sets the session cookie flags, registers the portal blueprint (its views live
in the modules imported below) and the template helpers. Views parse the form, call one service and
render; access rules stay in ``services.policy``.
"""

from __future__ import annotations

from flask import Flask

from dlts.portal.core import bp, install


def init_portal(app: Flask) -> None:
    # the views register themselves on ``bp`` when imported
    from dlts.portal import views_access, views_admin, views_auth, views_cluster, views_jobs, views_repair  # noqa: F401

    install(app)
    app.register_blueprint(bp)
