"""storm-mm: the machine manager (job store, queue, matrix, heartbeats)."""
