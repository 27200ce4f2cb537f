"""The impure shell around the scheduler core: snapshot -> decide -> backend -> reconcile."""

from dlts.jobmanager.manager import JobManager

__all__ = ["JobManager"]
