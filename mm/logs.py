"""How storm's daemons log: one line format on stderr, shared by storm-mm and storm-nm, each line naming
its daemon (an NM's name includes its node, so that lines from several nodes can be told apart)."""

from __future__ import annotations

import logging
import sys


def configure_logging(level: str, name: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format=f"%(asctime)s {name} %(levelname)s %(message)s",
        stream=sys.stderr,
    )
