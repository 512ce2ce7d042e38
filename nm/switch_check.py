"""Whether a context switch took effect: the node manager polls /proc until every signalled process is in
the state it was signalled to (stopped: 'T'; continued: anything else), or gives up after VERIFY_LIMIT.

The decision and the signals are the core's (nm/switcher.py); this is the daemon's side, since it waits.
"""

from __future__ import annotations

import asyncio
import logging
import time

from storm.nm.processes import Processes
from storm.nm.switcher import SwitchCheck

log = logging.getLogger("storm.nm")

VERIFY_POLL = 0.0005
VERIFY_LIMIT = 0.5


async def verify(processes: Processes, check: SwitchCheck) -> float:
    """Poll until the switch took effect; returns when (time.time()), or when the check gave up."""
    deadline = (check.begun or check.received) + VERIFY_LIMIT
    pending = dict(check.expected)
    while pending:
        states = processes.states(list(pending))
        for pid, running in list(pending.items()):
            state = states.get(pid)
            if state is None or state == "Z" or (state == "T") != running:
                del pending[pid]  # gone, or in the wanted state
        if pending:
            if time.time() > deadline:
                log.warning(
                    "context switch %d: %d rank(s) not yet in their new state", check.seq, len(pending)
                )
                break
            await asyncio.sleep(VERIFY_POLL)
    return time.time()
