"""storm sim: a discrete-event simulator that runs storm-mm's own core (see tools/sim/engine.py)."""
