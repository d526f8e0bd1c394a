"""scalerl_operator: the Kubernetes side of scalerl, laid out by concern (lower layers never import higher ones;
import-linter's contracts in pyproject.toml enforce it):

- `api/`: the RLJob custom resource: its pydantic models (spec, status, conditions), the one source of
  the CRD (`python -m scalerl_operator.api.crd > crd.yaml`);
- `render/`: what an RLJob becomes: the child objects (ConfigMap, Deployments, StatefulSet, Services,
  PodDisruptionBudget), their names, labels, images and devices; pure;
- `cluster/`: the operator's reads and writes of the cluster: the Kubernetes API client, the job's
  Kafka credentials, the learner's metrics topic, the scheduler's verdicts on pods;
- `autoscale/`: the RL-aware autoscaler: the pure decision math (HPA v2 semantics) and one pass per job;
- `control/`: the kopf handlers, reconciliation, the job's status, the learner gang, Kueue admission,
  the work queue, leader election and the health endpoint;
- `__main__`: `python -m scalerl_operator`, the process.
"""

from scalerl_operator.api.spec import API_VERSION, GROUP, KIND, PLURAL, SHORT_NAME, SINGULAR, VERSION

__all__ = ["API_VERSION", "GROUP", "KIND", "PLURAL", "SHORT_NAME", "SINGULAR", "VERSION"]
