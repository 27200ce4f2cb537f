"""Collectors: each reads one part of the machine and returns a typed sample.

Every collector is switched on or off in the config and is run by ``run_collector``, which times
it and turns any exception into a FAILED result (the collector's error metric goes up, the others
carry on). Malformed individual items are skipped and reported as errors without failing the
collector. Every OS boundary (``/proc``, ``/sys``, NVML, the clock) is a constructor argument.
"""
