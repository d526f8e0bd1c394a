"""Fault injection for exactly-once testing (#27): seeded plans of faults (`plan`), the process-side injector
that fires them at crash points (`points`) and inside the bus (`bus`). A leaf of the package: the roles,
the bus and the store import it; the chaos driver and the accounting check live in `scalerl.chaos`.

A plan is off unless a role process is started with `scalerl serve --faults PLAN.json`; then every fault of
the plan fires once per run, in whichever process of its role reaches it first (see `points`)."""
