"""The rank side of a launch: launcher environment, fault injection, heartbeats and exit codes.
Command lines, scripts and the local supervisor that start ranks live in :mod:`hexiscale.launch`."""
