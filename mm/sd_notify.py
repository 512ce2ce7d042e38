"""sd_notify(3) for storm-mm and storm-nm, without libsystemd.

Under ``Type=notify`` systemd passes ``$NOTIFY_SOCKET``, the address of an AF_UNIX datagram socket: a path,
or an abstract name written with a leading ``@``. A daemon tells its state by sending one datagram of
newline-separated ``KEY=VALUE`` lines there: ``READY=1`` once it serves (until then ``systemctl start``
waits and units ordered after it do not start), ``STATUS=...`` (shown by ``systemctl status``),
``STOPPING=1`` as it shuts down and ``WATCHDOG=1`` every so often when the unit sets ``WatchdogSec=``.

The watchdog: systemd passes ``$WATCHDOG_USEC`` (and ``$WATCHDOG_PID``, the process it is meant for) and
kills and restarts a daemon that stays silent that long. Pings go out at half that interval from a task on
the daemon's own asyncio loop, so a loop that hangs (a blocking call, a busy handler) stops them and systemd
restarts the daemon; a ping from a separate thread would hide exactly that.

Without ``$NOTIFY_SOCKET`` (started by hand, by ``storm local`` or by tests) every call does nothing. A
failed send is logged and never raised: a daemon must not die because systemd went away.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import socket
from collections.abc import Mapping, MutableMapping

log = logging.getLogger("storm.sd_notify")

# The variables systemd sets for the daemon itself: they are removed from the environment once read, so
# that nothing the daemon starts (the NM's job shells and ranks) can pose as it (sd_notify's
# unset_environment).
VARIABLES = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")
_KEY = re.compile(r"[A-Z][A-Z0-9_]*")


class NotifyError(ValueError):
    """A message or an environment that cannot be turned into a notification."""


def format_message(fields: Mapping[str, object]) -> bytes:
    """``{"READY": 1, "STATUS": "serving"}`` -> ``b"READY=1\\nSTATUS=serving"``, in the given order.

    A value is one line: newlines in a status text become spaces (a newline would start another
    assignment, which systemd would parse as one).
    """
    if not fields:
        raise NotifyError("an empty notification")
    lines = []
    for key, value in fields.items():
        if not _KEY.fullmatch(key):
            raise NotifyError(f"{key!r} is not a notification key (upper case letters, digits and _)")
        text = str(value).replace("\r", " ").replace("\n", " ")
        lines.append(f"{key}={text}")
    return "\n".join(lines).encode()


def socket_address(value: str) -> str | bytes:
    """The address to send to: a path as is, ``@name`` as the abstract name ``\\0name``."""
    if value.startswith("@") and len(value) > 1:
        return b"\0" + value[1:].encode()
    if value.startswith("/"):
        return value
    # systemd 254 also offers vsock:CID:PORT (for virtual machines), which storm's daemons do not use.
    raise NotifyError(f"NOTIFY_SOCKET={value!r} is neither a path nor an abstract socket name (@...)")


def watchdog_interval(environ: Mapping[str, str], pid: int) -> float | None:
    """Seconds between pings (half of $WATCHDOG_USEC), or None if no watchdog is asked of ``pid``."""
    usec = environ.get("WATCHDOG_USEC", "")
    if not usec:
        return None
    if not usec.isdigit() or int(usec) == 0:
        raise NotifyError(f"WATCHDOG_USEC={usec!r} is not a positive number of microseconds")
    target = environ.get("WATCHDOG_PID", "")
    if target:
        if not target.isdigit():
            raise NotifyError(f"WATCHDOG_PID={target!r} is not a process id")
        if int(target) != pid:
            return None  # meant for another process (we were started by the one it names)
    return int(usec) / 2 / 1e6


class Notifier:
    """Notifications to the service manager; every method does nothing when there is none."""

    def __init__(self, address: str | bytes | None = None, watchdog: float | None = None) -> None:
        self.address = address
        self.watchdog_seconds = watchdog if address is not None else None
        self._warned = False

    @classmethod
    def from_environment(
        cls, environ: MutableMapping[str, str] | None = None, pid: int | None = None, unset: bool = True
    ) -> Notifier:
        """Read (and by default remove) systemd's variables. A malformed one is logged and ignored."""
        env = os.environ if environ is None else environ
        value = env.get("NOTIFY_SOCKET", "")
        address: str | bytes | None = None
        watchdog = None
        try:
            address = socket_address(value) if value else None
            watchdog = watchdog_interval(env, os.getpid() if pid is None else pid)
        except NotifyError as exc:
            log.warning("not notifying systemd: %s", exc)
            address = None
        if unset:
            for name in VARIABLES:
                env.pop(name, None)
        return cls(address, watchdog)

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def send(self, **fields: object) -> bool:
        """Send one notification; True if it was handed to the service manager's socket."""
        if self.address is None:
            return False
        data = format_message(fields)
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
                # Never block the daemon's loop on a full receive queue: a lost ping is better.
                s.sendto(data, socket.MSG_DONTWAIT, self.address)
        except OSError as exc:
            if not self._warned:  # once: a vanished manager would otherwise fill the log every ping
                log.warning("could not notify systemd at %r: %s", self.address, exc)
                self._warned = True
            return False
        return True

    def ready(self, status: str) -> bool:
        return self.send(READY=1, STATUS=status)

    def status(self, status: str) -> bool:
        return self.send(STATUS=status)

    def stopping(self, status: str = "stopping") -> bool:
        return self.send(STOPPING=1, STATUS=status)

    async def watchdog(self) -> None:
        """Ping for as long as the loop runs (a task of the daemon; cancelled at shutdown)."""
        if self.watchdog_seconds is None:
            return
        while True:
            self.send(WATCHDOG=1)
            await asyncio.sleep(self.watchdog_seconds)
