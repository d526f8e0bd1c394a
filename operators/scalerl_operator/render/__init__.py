"""What an RLJob becomes in the cluster: the desired child objects as plain dicts, pure (no API call, no clock).

Owns the rendering of the ConfigMap, Deployments, learner StatefulSet, Services and PodDisruptionBudget
(`children`), the names, labels, selectors and Kafka topics every other layer keys on (`names`), the
operator's image defaults and their pinning (`images`), the devices a job holds (`devices`) and what the
Kafka security and S3 settings add to the pods (`secure`). May import `scalerl_operator.api`,
`scalerl.config` and `scalerl.scaling.devices`; never `cluster`, `autoscale` or `control`, nor Kafka,
storage or gRPC code.
"""
