"""mpihook: the monitoring layer loaded into every MPI rank."""
