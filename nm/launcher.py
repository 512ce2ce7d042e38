"""The job shell launcher: a pre-imported, single-threaded process that forks job shells on request.

Starting a job shell as a new Python process costs about 100 ms of CPU (80 ms of imports), which capped
storm at ~10 jobs/s on two cores. The NM instead keeps this small process, started once: it imports the job
shell's code but creates no threads, so it may safely fork. For each job shell (one per user on the node,
which serves all the user's jobs there: nm/shell_server.py) it forks a child that becomes the session
leader, drops to the user (groups, gid, uid), and runs :func:`storm.nm.shell_server.run_shell_server`.

It talks to its NM over a SOCK_SEQPACKET socket pair: a request is a msgpack map ``{shell, uid, gid, groups}``
(``shell`` holding the keyword arguments of :func:`storm.nm.shell_server.run_shell_server`)
with the shell's log file passed as a descriptor; the reply is ``{pid}`` with a pidfd of the new shell (or
``{error}``). The pidfd is opened while the launcher still holds the child unreaped, so it can never name a
recycled pid; the launcher reaps its children as they exit. When the NM goes away (the socket reaches EOF)
the launcher exits, and running shells live on, parented by init.
"""

from __future__ import annotations

import array
import contextlib
import gc
import os
import signal
import socket
import subprocess
import sys
import traceback

import msgpack

MAX_REQUEST = 1 << 16


class LaunchError(RuntimeError):
    pass


def _send(sock: socket.socket, body: dict[str, object], fd: int | None = None) -> None:
    data = msgpack.packb(body)
    ancillary = [] if fd is None else [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))]
    sock.sendmsg([data], ancillary)


def _recv(sock: socket.socket) -> tuple[dict[str, object] | None, int | None]:
    """One message and the descriptor that came with it; (None, None) at EOF."""
    fds = array.array("i")
    data, ancdata, _flags, _addr = sock.recvmsg(MAX_REQUEST, socket.CMSG_SPACE(fds.itemsize))
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    if not data:
        return None, None
    body = msgpack.unpackb(data)
    return (body if isinstance(body, dict) else {}), (fds[0] if fds else None)


# ---------------------------------------------------------------------------------------------- NM side


class Launcher:
    """The NM's handle on its launcher process."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = {"PATH": os.environ.get("PATH", os.defpath), "LANG": os.environ.get("LANG", "C.UTF-8")}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "storm.nm.launcher", str(theirs.fileno())],
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
            env=env,
            close_fds=True,
        )
        theirs.close()
        self._sock = ours

    def spawn(
        self, shell: dict[str, object], *, uid: int, gid: int, groups: list[int], log: int
    ) -> tuple[int, int]:
        """Fork a job shell running ``run_shell_server(**shell)`` as uid/gid; return its pid and a pidfd."""
        _send(self._sock, {"shell": shell, "uid": uid, "gid": gid, "groups": groups}, log)
        reply, pidfd = _recv(self._sock)
        if reply is None:
            raise LaunchError("the job shell launcher has died")
        if "error" in reply or pidfd is None:
            if pidfd is not None:
                os.close(pidfd)
            raise LaunchError(str(reply.get("error", "no pidfd in the launcher's reply")))
        pid = reply["pid"]
        assert isinstance(pid, int)
        return pid, pidfd

    def close(self) -> None:
        self._sock.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=5)


# ---------------------------------------------------------------------------------------------- launcher side


def _reap(_signum: int, _frame: object) -> None:
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass


def _become_shell(sock: socket.socket, request: dict[str, object], log: int) -> None:
    """In the forked child: never returns."""
    code = 1
    try:
        sock.close()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, set())
        os.setsid()
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))
        uid, gid, groups = request["uid"], request["gid"], request["groups"]
        assert isinstance(uid, int) and isinstance(gid, int) and isinstance(groups, list)
        if uid != os.geteuid() or gid != os.getegid():
            os.setgroups(groups)
            os.setgid(gid)
            os.setuid(uid)
        os.chdir("/")
        gc.enable()
        from storm.nm.shell_server import run_shell_server

        kwargs = request["shell"]
        assert isinstance(kwargs, dict)
        code = run_shell_server(**kwargs)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def serve(control: int) -> int:
    # Everything a job shell needs is imported here once, before any fork. Freezing the heap keeps the
    # children's garbage collector from touching (and so copying) every inherited page.
    gc.disable()
    from storm.mm.protocol import prepare_decoding
    from storm.nm import shell_server  # noqa: F401

    prepare_decoding()
    gc.freeze()

    sock = socket.socket(fileno=control)
    signal.signal(signal.SIGCHLD, _reap)
    while True:
        try:
            request, log = _recv(sock)
        except (OSError, ValueError) as exc:
            print(f"storm-launcher: bad request: {exc}", file=sys.stderr)
            continue
        if request is None:
            return 0  # the NM is gone
        if log is None:
            _send(sock, {"error": "no log descriptor in the request"})
            continue
        # No reaping between the fork and the pidfd: the pid must still be our unreaped child.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
        try:
            pid = os.fork()
            if pid == 0:
                _become_shell(sock, request, log)
            pidfd = os.pidfd_open(pid)
        except OSError as exc:
            _send(sock, {"error": f"cannot start the job shell: {exc}"})
            os.close(log)
            continue
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
        os.close(log)
        _send(sock, {"pid": pid}, pidfd)
        os.close(pidfd)


if __name__ == "__main__":
    sys.exit(serve(int(sys.argv[1])))
