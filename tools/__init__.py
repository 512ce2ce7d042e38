"""The storm command line and the operator and experiment tools."""
