"""storm-mm: the machine manager daemon (``storm-mm --help``)."""

from __future__ import annotations

import argparse
import logging
import sys

from storm.mm.config import ConfigError, add_arguments, from_arguments


def configure_logging(level: str, name: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format=f"%(asctime)s {name} %(levelname)s %(message)s",
        stream=sys.stderr,
    )


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
