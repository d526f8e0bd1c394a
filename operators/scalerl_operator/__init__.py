"""scalerl_operator: the Kubernetes side of scalerl.

`spec` holds the RLJob custom resource as pydantic models (the one source of the CRD schema),
`conditions` the status condition types, reasons and the `set_condition` helper, and `crd` turns the
models into the CustomResourceDefinition (`python -m scalerl_operator.crd > crd.yaml`).
"""

from scalerl_operator.spec import API_VERSION, GROUP, KIND, PLURAL, SHORT_NAME, SINGULAR, VERSION

__all__ = ["API_VERSION", "GROUP", "KIND", "PLURAL", "SHORT_NAME", "SINGULAR", "VERSION"]
