"""The ``storm`` program as a shell starts it (pyproject.toml's ``[project.scripts]``): tools/cli.py's main(),
with Python's cyclic garbage collector set for a process that lives a few tens of milliseconds.

Importing what a ``storm submit`` needs creates some 17,000 objects that the collector tracks (classes,
functions, the message types) and that live until the process ends; the collector examines them in some 40
collections while the command starts, and all of them again at exit, only to find nothing to free: 35 of
the 245 million instructions a ``storm queue`` ran beyond Python's own start (callgrind, issue 18). So the
collector is off while the command imports; a command that asks storm-mm one thing and exits (SHORT) runs
with it off too and freezes what exists at its end, so that the exit does not walk it; every other command
(a benchmark, the simulator, ``storm watch``, ``storm local up``) runs with the collector on, as any
program. The exit still flushes output, runs exit handlers and closes sockets; only garbage in reference
cycles is not collected, and the kernel frees it with the process.

A SHORT command also reaches a local storm-mm without pyzmq, whose import takes longer than the rest of
the command (client.ONE_SHOT: tools/zmtp.py's Dealer, which connects once and does not reconnect).

``python -m storm.tools.cli`` and tests that call cli.main() are not affected.
"""

from __future__ import annotations

import gc
import sys

# Commands that send storm-mm a request or two and exit (``--wait`` waits for a reply, allocating nothing).
SHORT = frozenset({"submit", "cancel", "queue", "show", "nodes", "matrix", "stats", "classes"})


def short(argv: list[str]) -> bool:
    """Whether ``argv`` runs one of the SHORT commands: its first word that is neither an option nor the
    value of ``--mm``. Anything unexpected (an abbreviated option, no command) counts as not short, which
    only means the collector runs, as it would in any Python program."""
    words = iter(argv)
    for word in words:
        if word == "--mm":
            next(words, None)
        elif not word.startswith("--mm="):
            return word in SHORT
    return False


def main() -> None:
    gc.disable()
    from storm.tools.cli import main as cli_main  # with everything it imports, while the collector is off

    quick = short(sys.argv[1:])
    if quick:
        from storm.tools import client

        client.ONE_SHOT = True
    else:
        gc.enable()
    try:
        status = cli_main()
    finally:
        if quick:
            gc.freeze()
    sys.exit(status)
