"""Fault injection for exactly-once testing (#27): seeded plans of faults (`plan`), the process-side injector
that fires them at crash points and inside the bus (`inject`), and the accounting identity checked from the
bus and the store at the end of a run (`accounting`).

A plan is off unless a role process is started with `scalerl serve --faults PLAN.json`; then every fault of
the plan fires once per run, in whichever process of its role reaches it first (see `inject`)."""
