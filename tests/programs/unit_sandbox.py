"""Run a command under the privilege and syscall restrictions of storm-mm.service, then exec it.

systemd is not PID 1 where the tests run, so the unit cannot be started as such; this applies by hand the
parts of its sandbox that decide whether the daemon can work at all, in the order systemd applies them:

  ProtectSystem=strict,          a mount namespace where every mount is read-only but the DIRs
    ReadWritePaths=DIR...           (StateDirectory= and RuntimeDirectory= in the unit)
  ProtectProc=invisible,         a new /proc showing only the service's own processes and no system files
    ProcSubset=pid
  PrivateDevices=yes             a /dev of null, zero, full, random, urandom and an empty shm
  LimitRTPRIO=N                  setrlimit(RLIMIT_RTPRIO) (needs CAP_SYS_RESOURCE; skipped with a note if
                                 this machine refuses it, and the daemon must then run at ordinary priority)
  CapabilityBoundingSet=         every capability dropped from the bounding set
  User=, Group=                  setgroups([]), setgid, setuid: no capability is left
  NoNewPrivileges=yes            prctl(PR_SET_NO_NEW_PRIVS)
  MemoryDenyWriteExecute=yes     prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN), the kernel's own form (6.3+)
  SystemCallFilter=, SystemCallErrorNumber=EPERM
                                 a seccomp allow-list loaded with libseccomp; every other call fails EPERM
  WATCHDOG_PID                   set to this pid, which the command keeps (exec), as systemd does

Not emulated: ProtectHome= (this Python may live under /root), PrivateTmp= (the test's files are in /tmp),
the Protect{Kernel*,ControlGroups,Clock,Hostname}= settings and RestrictAddressFamilies=.

Usage: unit_sandbox.py --user NAME [--writable DIR ...] [--rtprio N] [--syscalls FILE] -- COMMAND...
It prints one line "rtprio: ok" or "rtprio: refused (...)" to stderr before exec.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import errno
import os
import pwd
import resource
import stat
import sys

CLONE_NEWNS = 0x00020000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND, MS_REC, MS_PRIVATE = 0x2, 0x4, 0x8, 0x1000, 0x4000, 0x40000
MOUNT_ATTR_RDONLY = 0x1
AT_FDCWD, AT_RECURSIVE = -100, 0x8000
SYS_MOUNT_SETATTR = 442  # the same number on every architecture (Linux 5.12)
DEVICES = {"null": 3, "zero": 5, "full": 7, "random": 8, "urandom": 9}  # major 1, these minors
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_SET_MDWE = 65
PR_MDWE_REFUSE_EXEC_GAIN = 1
SCMP_ACT_ALLOW = 0x7FFF0000
SCMP_ACT_ERRNO_BASE = 0x00050000


def fail(what: str) -> None:
    err = ctypes.get_errno()
    print(f"unit_sandbox: {what}: {os.strerror(err) if err else 'failed'}", file=sys.stderr)
    sys.exit(126)


class MountAttr(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in ("attr_set", "attr_clr", "propagation", "userns_fd")]


def bytes_or_none(text: str | None) -> bytes | None:
    return None if text is None else text.encode()


def private_file_system(libc: ctypes.CDLL, writable: list[str]) -> None:
    def mount(
        source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None
    ) -> None:
        if libc.mount(
            bytes_or_none(source), target.encode(), bytes_or_none(fstype), flags, bytes_or_none(data)
        ):
            fail(f"mounting {target}")

    def set_readonly(path: str, readonly: bool, flags: int) -> None:
        attr = MountAttr(MOUNT_ATTR_RDONLY if readonly else 0, 0 if readonly else MOUNT_ATTR_RDONLY, 0, 0)
        size = ctypes.sizeof(attr)
        if libc.syscall(SYS_MOUNT_SETATTR, AT_FDCWD, path.encode(), flags, ctypes.byref(attr), size) != 0:
            fail(f"mount_setattr {path}")

    if libc.unshare(CLONE_NEWNS) != 0:
        fail("unshare(CLONE_NEWNS)")
    mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing done here reaches the host
    set_readonly("/", True, AT_RECURSIVE)
    for path in writable:
        mount(path, path, None, MS_BIND | MS_REC)
        set_readonly(path, False, AT_RECURSIVE)
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "hidepid=invisible,subset=pid")
    mount("tmpfs", "/dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=0755,size=64k")
    for name, minor in DEVICES.items():
        os.mknod(f"/dev/{name}", 0o666 | stat.S_IFCHR, os.makedev(1, minor))
        os.chmod(f"/dev/{name}", 0o666)  # noqa: S103 (as systemd makes them; the umask took some bits)
    os.mkdir("/dev/shm", 0o1777)
    mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")


def load_seccomp(names: list[str]) -> None:
    path = ctypes.util.find_library("seccomp")
    if path is None:
        print("unit_sandbox: libseccomp is not installed", file=sys.stderr)
        sys.exit(125)
    lib = ctypes.CDLL(path, use_errno=True)
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint]
    lib.seccomp_load.argtypes = [ctypes.c_void_p]
    ctx = lib.seccomp_init(SCMP_ACT_ERRNO_BASE | errno.EPERM)
    if not ctx:
        fail("seccomp_init")
    for name in names:
        number = lib.seccomp_syscall_resolve_name(name.encode())
        if number < 0:  # not a system call of this architecture (systemd's lists name every architecture's)
            continue
        if lib.seccomp_rule_add(ctx, SCMP_ACT_ALLOW, number, 0) != 0:
            fail(f"seccomp_rule_add {name}")
    if lib.seccomp_load(ctx) != 0:
        fail("seccomp_load")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--user", required=True)
    parser.add_argument("--writable", action="append", default=[])
    parser.add_argument("--rtprio", type=int, default=0)
    parser.add_argument("--syscalls", default="")
    parser.add_argument("command", nargs="+")
    args = parser.parse_args()
    libc = ctypes.CDLL(None, use_errno=True)
    user = pwd.getpwnam(args.user)  # before /proc and /dev change: NSS may need them
    if args.writable:
        private_file_system(libc, args.writable)
    if args.rtprio:
        try:
            resource.setrlimit(resource.RLIMIT_RTPRIO, (args.rtprio, args.rtprio))
            print("rtprio: ok", file=sys.stderr)
        except (OSError, ValueError) as exc:  # ValueError: raising the hard limit without CAP_SYS_RESOURCE
            print(f"rtprio: refused ({exc})", file=sys.stderr)
    for cap in range(64):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() != errno.EINVAL:
            fail(f"dropping capability {cap}")
    os.setgroups([])
    os.setgid(user.pw_gid)
    os.setuid(user.pw_uid)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        fail("PR_SET_NO_NEW_PRIVS")
    if libc.prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN, 0, 0, 0) != 0:
        fail("PR_SET_MDWE (Linux 6.3 or later)")
    os.environ["WATCHDOG_PID"] = str(os.getpid())
    if args.syscalls:
        with open(args.syscalls) as f:
            load_seccomp(f.read().split())
    os.execvp(args.command[0], args.command)  # noqa: S606 (exec, keeping this pid: WATCHDOG_PID names it)


if __name__ == "__main__":
    main()
