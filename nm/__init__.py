"""storm-nm: the node manager (job shells, PMI, local scheduling)."""
