"""Pure parsers for the text ``lfs`` and ``lctl`` print: text (and the tool version) in, frozen
dataclasses out, ``LustreParseError`` on anything unexpected. No I/O here.
"""
from dlts_lustre.parsers.df import parse_df, parse_df_single
from dlts_lustre.parsers.health import parse_health
from dlts_lustre.parsers.layout import parse_getdirstripe, parse_getdirstripe_mdt, parse_getstripe, parse_project
from dlts_lustre.parsers.pools import parse_pool_list, parse_pool_members
from dlts_lustre.parsers.quota import parse_default_quota, parse_grace_times, parse_quota
from dlts_lustre.parsers.stats import compute_rates, parse_stats
from dlts_lustre.parsers.version import parse_version

__all__ = [
    "compute_rates", "parse_default_quota", "parse_df", "parse_df_single", "parse_getdirstripe",
    "parse_getdirstripe_mdt", "parse_getstripe", "parse_grace_times", "parse_health",
    "parse_pool_list", "parse_pool_members", "parse_project", "parse_quota", "parse_stats",
    "parse_version",
]
