"""storm-nm: the node manager daemon (``storm-nm --help``)."""

from __future__ import annotations

import argparse
import sys

from storm.mm.config import ConfigError, add_arguments, from_arguments
from storm.mm.logs import configure_logging


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="storm-nm",
        description="The storm node manager: launches, schedules and stops the ranks of jobs on this node.",
    )
    add_arguments(parser, ("cluster", "nm"))
    args = parser.parse_args(argv)
    try:
        config = from_arguments(args)
    except ConfigError as exc:
        parser.error(str(exc))
    configure_logging(config.nm.log_level, f"storm-nm[{config.node_name()}]")
    from storm.nm.daemon import serve

    serve(config)
    return 0


if __name__ == "__main__":
    sys.exit(main())
