"""storm-mm: the machine manager daemon (``storm-mm --help``)."""

from __future__ import annotations

import argparse
import sys

from storm.mm.config import ConfigError, add_arguments, from_arguments
from storm.mm.logs import configure_logging


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="storm-mm",
        description="The storm machine manager: job store, queue, placement and time slices.",
    )
    add_arguments(parser, ("cluster", "mm", "fcs"))
    args = parser.parse_args(argv)
    try:
        config = from_arguments(args)
    except ConfigError as exc:
        parser.error(str(exc))
    configure_logging(config.mm.log_level, "storm-mm")
    from storm.mm.daemon import serve

    serve(config)
    return 0


if __name__ == "__main__":
    sys.exit(main())
