"""``dlts-agent``: run the agent as a service, or print one collection (``--once``)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading

from dlts_agent import __version__
from dlts_agent.config import ConfigError, load_config


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dlts-agent", description="DLTS node agent: metrics, GPU health, repair actions.")
    p.add_argument("--config", "-c", help="YAML config (default $DLTS_AGENT_CONFIG or /etc/dlts/agent.yaml)")
    p.add_argument("--once", action="store_true", help="collect once, print metrics and findings, exit")
    p.add_argument("--format", choices=("prom", "json"), default="prom", help="output of --once (default prom)")
    p.add_argument("--check-config", action="store_true", help="validate the config and exit")
    p.add_argument(
        "--fake-nvml",
        metavar="SCENARIO",
        help="use the fake NVML with a named scenario (tests and demos only): "
        "healthy-8xa100, dbe-gpu3, remap-pending, remap-failure, retired-pages, "
        "fallen-off-bus, not-supported, init-failure",
    )
    p.add_argument("--version", action="version", version=f"dlts-agent {__version__}")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        cfg = load_config(args.config)
    except ConfigError as e:
        print(f"dlts-agent: config error: {e}", file=sys.stderr)
        return 2
    if args.check_config:
        print(f"dlts-agent: config OK (node {cfg.effective_node_name})")
        return 0
    logging.basicConfig(
        level=getattr(logging, cfg.log_level.upper()), stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s"
    )
    nvml_lib = None
    if args.fake_nvml:
        from dlts_agent.nvml import real_gpu_devices
        from dlts_testing.fake_nvml import scenario

        devices = real_gpu_devices()
        if devices:
            print(f"dlts-agent: --fake-nvml is refused on a machine with NVIDIA devices ({devices[0]}); "
                  "the fake NVML is for tests and demos on machines without GPUs", file=sys.stderr)
            return 2
        try:
            nvml_lib = scenario(args.fake_nvml)
        except ValueError as e:
            print(f"dlts-agent: {e}", file=sys.stderr)
            return 2
    from dlts_agent.agent import Agent

    if args.once:
        agent = Agent(cfg, nvml_lib=nvml_lib, persistent=False)
        try:
            snap = agent.collect_once()
        finally:
            agent.close()
        from dlts_agent.metrics import render_json, render_prom

        out = render_json(snap) if args.format == "json" else render_prom(snap) + _findings_comment(snap)
        sys.stdout.write(out if out.endswith("\n") else out + "\n")
        return 0
    try:
        agent = Agent(cfg, nvml_lib=nvml_lib)
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        agent.run(stop)
    except ConfigError as e:
        print(f"dlts-agent: config error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"dlts-agent: cannot start: {e}", file=sys.stderr)
        return 1
    return 0


def _findings_comment(snap) -> str:
    """Findings as '#' comment lines after the metrics, so the output stays valid exposition text."""
    if not snap.findings:
        return "# findings: none\n"
    lines = [f"# findings: {len(snap.findings)}"]
    for f in snap.findings:
        lines.append(f"# finding {f.severity.value} {f.code.value} {f.device} -> {f.action.value}: {f.message}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
