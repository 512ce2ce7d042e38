"""mpihook: the monitoring layer loaded into every MPI rank.

The hook is a C PMPI library (hook.c, p2p.c, coll.c) that storm-nm puts in LD_PRELOAD of the ranks only. It
counts blocking communication calls and events and the time spent in them, publishes them in the job's
shared-memory segment (record.h; the NM's reader is stats.py), and waits in blocking calls the way the NM asks
(busy polling or spin-block). The package builds it as ``storm.mpihook._hook`` next to this file, an
extension module in name only: it is never imported.
"""

from __future__ import annotations

from pathlib import Path

# What a rank's environment needs so that its blocking collectives can spin-block: MPICH's shared-memory
# algorithms for these wait in loops that never yield the CPU; "mpir" runs them over point-to-point messages,
# which wait in MPICH's progress loop, where the hook can sleep (hook.c says what it costs). The hook checks
# for exactly these (its flag COLLECTIVES_POLL otherwise); storm's job shell sets them where a node may ask
# a rank to spin-block, unless the job set them itself.
SPIN_BLOCK_ENVIRONMENT = {
    f"MPIR_CVAR_{collective}_POSIX_INTRA_ALGORITHM": "mpir"
    for collective in ("BARRIER", "BCAST", "REDUCE", "ALLREDUCE", "ALLGATHER", "ALLGATHERV", "ALLTOALL")
}


def hook_library() -> Path:
    """The built hook library, to put in a rank's LD_PRELOAD.

    Raises FileNotFoundError (an OSError) if the package was installed without building it.
    """
    here = Path(__file__).resolve().parent
    found = sorted(here.glob("_hook*.so"))
    if not found:
        raise FileNotFoundError(
            f"mpihook's library (_hook*.so) is not in {here}: reinstall storm with a C compiler "
            "(pip install builds it)"
        )
    return found[0]
