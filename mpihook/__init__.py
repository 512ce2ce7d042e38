"""mpihook: the monitoring layer loaded into every MPI rank.

The hook is a C PMPI library (hook.c, p2p.c, coll.c) that storm-nm puts in LD_PRELOAD of the ranks only. It
counts blocking communication calls and events and the time spent in them, publishes them in the job's
shared-memory segment (record.h; the NM's reader is stats.py), and waits in blocking calls the way the NM asks
(busy polling or spin-block). The package builds it as ``storm.mpihook._hook`` next to this file, an
extension module in name only: it is never imported.
"""

from __future__ import annotations

from pathlib import Path


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
