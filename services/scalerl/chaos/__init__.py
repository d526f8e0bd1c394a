"""Chaos runs (#27): a distributed job under a seeded fault plan (`run`), checked at the end by the accounting
identity read from the bus and the store (`accounting`). It drives processes and reads the transports, so it
sits above `scalerl.runtime`, `scalerl.bus` and `scalerl.store`; the faults themselves (`scalerl.faults`)
are a leaf those packages import."""
