"""The base of the RLJob's pydantic models and the size bounds they share (spec.py, status.py)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

# Bounds that keep the API server's CEL cost estimate small and objects reasonably sized.
MAX_URI_LENGTH = 1024
MAX_IMAGE_LENGTH = 512
MAX_MAP_ENTRIES = 32
MAX_TOLERATIONS = 32
MAX_POLICIES = 8
MAX_REPLICAS = 1024
MAX_CONDITIONS = 16


class K8sModel(BaseModel):
    """camelCase keys on the wire, snake_case in Python; unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True,
                              validate_assignment=True)
