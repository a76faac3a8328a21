"""`nezha controller`: keep the cache cluster's ring equal to its ready pods."""

from __future__ import annotations

import argparse
import asyncio

from nezha.config import ControllerSettings, load
from nezha.config.flags import add_settings, given
from nezha.logs import configure

def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("controller", help="run the controller of a cache StatefulSet (ring, scale, prefetch)")
    add_settings(p, ControllerSettings, command="controller")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from controller.run import run_controller

    settings = load(ControllerSettings, config_file=args.config, flags=given(args))
    configure(level=settings.log_level)
    asyncio.run(run_controller(settings))
    return 0
