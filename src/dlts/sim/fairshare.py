"""Fair-share use in a replay: each user's decayed GPU-seconds per VC, as the core is handed it.

The live job manager reads ``Snapshot.fair_share_usage`` from the accounting rollup (one row per
UTC day, dated at the day's middle; ``jobmanager/snapshot.fair_share_usage``). A replay knows every
GPU-second to the instant, so it decays continuously: a GPU held during ``[a, b)`` adds, at time
``t >= b``, ``H / ln 2 * (0.5 ** ((t - b) / H) - 0.5 ** ((t - a) / H))`` GPU-seconds, ``H`` being
the half-life. Preemptible GPU time counts as the live rollup counts it; CPU-only work adds nothing.

``DecayedUse`` keeps the sum as the replay runs: the engine tells it every change of what a user
holds, and the RESULT checker (``verify``) feeds it the attempts a RESULT records.
"""

from __future__ import annotations

import math

LN2 = math.log(2)
Key = tuple[str, str]  # (vc, user)


class DecayedUse:
    """(vc, user) -> decayed GPU-seconds at the time of the last ``advance``."""

    def __init__(self, half_life_s: float) -> None:
        if half_life_s <= 0:
            raise ValueError("half_life_s must be > 0")
        self.half_life_s = half_life_s
        self.at = 0.0
        self.use: dict[Key, float] = {}
        self.held: dict[Key, int] = {}  # GPUs held now

    def advance(self, t: float) -> None:
        """Bring every user's use to time ``t`` (the GPUs held since the last call, decayed)."""
        dt = t - self.at
        if dt <= 0:
            return
        f = 0.5 ** (dt / self.half_life_s)
        per_gpu = self.half_life_s / LN2 * (1.0 - f)  # one GPU held over [at, t], decayed to t
        use, held = self.use, self.held
        for k in use.keys() | held.keys():
            use[k] = use.get(k, 0.0) * f + held.get(k, 0) * per_gpu
        self.at = t

    def hold(self, key: Key, gpus: int, t: float) -> None:
        """From ``t`` on, ``key`` holds ``gpus`` more GPUs (fewer when negative)."""
        if not gpus:
            return
        self.advance(t)
        n = self.held.get(key, 0) + gpus
        if n:
            self.held[key] = n
        else:
            del self.held[key]

    def at_time(self, t: float) -> dict[Key, float]:
        """The use at ``t``, for ``Snapshot.fair_share_usage`` (users with none left out)."""
        self.advance(t)
        return {k: v for k, v in self.use.items() if v > 0.0}

