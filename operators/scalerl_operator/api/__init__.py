"""The RLJob custom resource (`scalerl.dev/v1alpha1`): what a user writes and what the operator reports.

Owns the pydantic models of the spec (`spec`, with the roles' `autoscaling` settings and the `infra` the
job runs on: Kafka, S3, telemetry; `podtemplate` for pod-template overrides), of the status (`status`)
and its conditions (`conditions`), how fields only a newer CRD serves are told apart (`newer_fields`),
and the CustomResourceDefinition generated from the models (`crd`; `python -m scalerl_operator.api.crd`).
May import pydantic, PyYAML and `scalerl.config` (spec.job is a JobSpec); nothing else of the operator
and no service, transport or storage code of scalerl: it is the bottom layer.
"""
