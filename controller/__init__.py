"""Controller: P4Runtime driver, reuse-value policy, simulator and daemons."""
