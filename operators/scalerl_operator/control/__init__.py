"""The controller: what runs the RLJobs, top layer of the operator.

Owns the kopf handlers (`handlers`) and the process's state and per-job pass (`runtime`), the finalizer's
clean-up (`cleanup`), the level-based reconcile of one RLJob (`reconcile`) and its status (`jobstatus`),
the learner's gang restarts (`gang`), Kueue admission (`kueue`), the shared work queue of periodic passes (`workqueue`),
leader election over a Lease (`leader`) and the process's health endpoint (`health`). May import every
other layer of the operator (`api`, `render`, `cluster`, `autoscale`) and scalerl's bus and store
clients; nothing imports it but `scalerl_operator.__main__`.
"""
