"""The in-tree plugin registry and the named profiles.

Every built-in plugin is listed here, once, by extension point and name; nothing registers itself
when a module is imported. A factory receives a ``PluginHandle`` (what a plugin may ask of the
pass's other plugins, e.g. the placer for a request) and returns the plugin. A ``Profile`` names
the plugins one pass runs; the config chooses a profile by name (``scheduler_profile``), and a test
or an operator's code builds a registry with more plugins by ``Registry.with_plugin`` (a new
registry: the built-in one is never changed).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from dlts.scheduler.framework import (
    FilterPlugin,
    PlacePlugin,
    PluginHandle,
    PolicyPlugin,
    PreemptPlugin,
    SortPlugin,
    StopPlugin,
)
from dlts.scheduler.model import Policy
from dlts.scheduler.plugins.admission import (
    Approval,
    InteractiveCap,
    NodeMatch,
    UserQuota,
    VcQuota,
)
from dlts.scheduler.plugins.backfill import BackfillPolicy
from dlts.scheduler.plugins.fairshare import FairShare
from dlts.scheduler.plugins.ordering import PriorityQueueTime
from dlts.scheduler.plugins.placement import BestFit, CpuOnly, Gang
from dlts.scheduler.plugins.policy import Fifo, RunnableFirst
from dlts.scheduler.plugins.reclaim import Reclaim
from dlts.scheduler.plugins.walltime import WallTime
from dlts.scheduler.state import Request

EXTENSION_POINTS = ("sort", "stop", "filter", "policy", "place", "preempt")

# a factory returns the plugin of its point; ``resolve`` checks it implements that point's protocol
Factory = Callable[[PluginHandle], object]


class Registry:
    """(extension point, name) -> factory. Immutable: ``with_plugin`` returns a new registry."""

    def __init__(self, factories: Mapping[str, Mapping[str, Factory]]) -> None:
        unknown = set(factories) - set(EXTENSION_POINTS)
        if unknown:
            raise ValueError(f"unknown extension point {min(unknown)!r}; expected one of {EXTENSION_POINTS}")
        self._factories: Mapping[str, Mapping[str, Factory]] = MappingProxyType(
            {p: MappingProxyType(dict(factories.get(p, {}))) for p in EXTENSION_POINTS}
        )

    def names(self, point: str) -> list[str]:
        return sorted(self._factories[point])

    def __contains__(self, point_name: tuple[str, str]) -> bool:
        point, name = point_name
        return name in self._factories.get(point, {})

    def with_plugin(self, point: str, name: str, factory: Factory) -> Registry:
        """This registry plus one plugin; a name already taken at that point is refused."""
        if point not in self._factories:
            raise ValueError(f"unknown extension point {point!r}; expected one of {EXTENSION_POINTS}")
        if name in self._factories[point]:
            raise ValueError(f"plugin {name!r} already registered at {point!r}")
        merged = {p: dict(f) for p, f in self._factories.items()}
        merged[point][name] = factory
        return Registry(merged)

    def create(self, point: str, name: str, handle: PluginHandle) -> object:
        try:
            factory = self._factories[point][name]
        except KeyError:
            known = ", ".join(self.names(point)) or "none"
            raise ValueError(f"profile names unknown {point} plugin {name!r} (known: {known})") from None
        return factory(handle)


BUILTIN = Registry(
    {
        "sort": {
            "priority_queue_time": lambda h: PriorityQueueTime(),
            "fair_share": lambda h: FairShare(),
        },
        "stop": {"wall_time": lambda h: WallTime()},
        "filter": {
            "approval": lambda h: Approval(),
            "node_match": lambda h: NodeMatch(h),
            "vc_quota": lambda h: VcQuota(),
            "user_quota": lambda h: UserQuota(),
            "interactive_cap": lambda h: InteractiveCap(),
        },
        "policy": {
            Policy.RF.value: lambda h: RunnableFirst(),
            Policy.FIFO.value: lambda h: Fifo(),
            Policy.BACKFILL.value: lambda h: BackfillPolicy(),
        },
        "place": {"gang": lambda h: Gang(), "cpu_only": lambda h: CpuOnly(), "best_fit": lambda h: BestFit()},
        "preempt": {"reclaim": lambda h: Reclaim()},
    }
)


@dataclass(frozen=True)
class Profile:
    """Which plugins one pass runs, by registered name, in order."""

    sort: str = "fair_share"  # priority_queue_time, re-ranked inside each VC by recent use
    stop: tuple[str, ...] = ("wall_time",)
    filter: tuple[str, ...] = ("approval", "node_match", "vc_quota", "user_quota", "interactive_cap")
    policy: tuple[str, ...] = ("RF", "FIFO", "backfill")
    place: tuple[str, ...] = ("gang", "cpu_only", "best_fit")
    preempt: tuple[str, ...] = ("reclaim",)


DEFAULT_PROFILE = Profile()

# The profiles the config may name (``scheduler_profile``).
PROFILES: Mapping[str, Profile] = MappingProxyType(
    {
        "default": DEFAULT_PROFILE,
        # no fair share: priority, then queue time (the 2020 order)
        "no_fair_share": Profile(sort="priority_queue_time"),
        # never preempt: preemptible jobs still run on idle capacity, but nothing is reclaimed
        "no_reclaim": Profile(preempt=()),
    }
)


def profile_named(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown scheduler profile {name!r} (known: {', '.join(sorted(PROFILES))})") from None


@dataclass
class Plugins:
    """A profile resolved to plugin instances; also the handle the plugins were given."""

    sort: SortPlugin
    stop: list[StopPlugin]
    filter: list[FilterPlugin]
    policy: dict[str, PolicyPlugin]
    place: list[PlacePlugin]
    preempt: list[PreemptPlugin]

    def placer_for(self, req: Request) -> PlacePlugin | None:
        return _first_placer(self.place, req)


def _first_placer(place: list[PlacePlugin], req: Request) -> PlacePlugin | None:
    for p in place:
        if p.handles(req):
            return p
    return None


class _Handle:
    """What factories get: the placers, filled in once the place plugins exist."""

    def __init__(self) -> None:
        self.place: list[PlacePlugin] = []

    def placer_for(self, req: Request) -> PlacePlugin | None:
        return _first_placer(self.place, req)


def resolve(profile: Profile, registry: Registry = BUILTIN) -> Plugins:
    """Instantiate the profile's plugins from ``registry``; unknown names fail with the known ones,
    and a factory that returns something that is not a plugin of its point fails by name."""
    handle = _Handle()

    def wrong(point: str, name: str, kind: str) -> TypeError:
        return TypeError(f"{point} plugin {name!r} does not implement {kind}")

    def place(name: str) -> PlacePlugin:
        p = registry.create("place", name, handle)
        if isinstance(p, PlacePlugin):
            return p
        raise wrong("place", name, "PlacePlugin")

    def policy(name: str) -> PolicyPlugin:
        p = registry.create("policy", name, handle)
        if isinstance(p, PolicyPlugin):
            return p
        raise wrong("policy", name, "PolicyPlugin")

    def sort(name: str) -> SortPlugin:
        p = registry.create("sort", name, handle)
        if isinstance(p, SortPlugin):
            return p
        raise wrong("sort", name, "SortPlugin")

    def stop(name: str) -> StopPlugin:
        p = registry.create("stop", name, handle)
        if isinstance(p, StopPlugin):
            return p
        raise wrong("stop", name, "StopPlugin")

    def filter_(name: str) -> FilterPlugin:
        p = registry.create("filter", name, handle)
        if isinstance(p, FilterPlugin):
            return p
        raise wrong("filter", name, "FilterPlugin")

    def preempt(name: str) -> PreemptPlugin:
        p = registry.create("preempt", name, handle)
        if isinstance(p, PreemptPlugin):
            return p
        raise wrong("preempt", name, "PreemptPlugin")

    handle.place = [place(n) for n in profile.place]
    policies = [policy(n) for n in profile.policy]
    return Plugins(
        sort=sort(profile.sort),
        stop=[stop(n) for n in profile.stop],
        filter=[filter_(n) for n in profile.filter],
        policy={p.name: p for p in policies},
        place=handle.place,
        preempt=[preempt(n) for n in profile.preempt],
    )
