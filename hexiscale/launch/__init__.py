"""Starting a plan's ranks: per-node command lines and scripts (pure text), and the local
supervisor. The rank side (environment, heartbeats, exit codes) is :mod:`executor.job`."""
