"""Small MPI programs used by the demo, the tests and the benchmarks."""
