"""Queries and writes shared by the services, the job manager and the portal.

Repositories read and write through the caller's session and never commit or roll back: the
services' ``transaction()`` (``dlts.services.transaction``) owns the unit of work.
"""
