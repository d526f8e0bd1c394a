"""The operator's reads and writes of the world outside its process.

Owns the dict-in / dict-out Kubernetes API client (`kube`), the job's own Kafka settings read from its
Secret (`kafka_access`, through `secrets`), the RL status read from the learner's metrics topic (`rlstatus`) and the
scheduler's verdict on Pending pods (`scheduling`, pure). May import `scalerl_operator.api` and
scalerl's bus security, message and envelope code; never `render`, `autoscale` or `control`.
"""
