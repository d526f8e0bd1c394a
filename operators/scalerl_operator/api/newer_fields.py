"""Fields an RLJob carries that this operator build does not know.

The API server prunes every field its CRD's structural schema does not declare, so a field unknown to
this build's models can only come from a newer CRD: during an operator upgrade (`helm upgrade` updates
the CRD first, and the old operator runs on until its pod is replaced), or a CRD applied ahead of the
operator. Such an RLJob is not invalid — the newer operator will read it — so the old one must not fail
it; `parse_spec` raises `FieldsFromNewerCRD` (a SpecError) when pruning these fields leaves a valid spec.
"""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel

from scalerl.config import JobSpec, SpecError


class FieldsFromNewerCRD(SpecError):
    """A spec valid but for fields this build does not know (`fields`: their dotted paths); `known`: the
    spec without them, validated (enough to clean up what the job holds, not to run it)."""

    def __init__(self, fields: list[str], known: Any) -> None:
        super().__init__(f"{', '.join(fields)}: not known to this operator build (a newer CRD serves them); "
                         "the job is left as it is until an operator that knows them reconciles it")
        self.fields, self.known = fields, known


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The model class inside `annotation` (X, X | None, list[X], dict[str, X]), else None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType, list, dict):
        for arg in typing.get_args(annotation):
            if (found := _model_in(arg)) is not None:
                return found
    return None


def prune_unknown(model: type[BaseModel], data: Any, path: str, nested: dict[str, type[BaseModel]],
                  found: list[str]) -> Any:
    """`data` without the keys `model` does not declare (by name or alias), recursively; their dotted
    paths are appended to `found`. `nested` names dict-typed fields validated as a model (`spec.job`)."""
    if not isinstance(data, dict):
        return data
    fields = {(f.alias or name): f for name, f in model.model_fields.items()}
    fields.update(model.model_fields)
    out: dict[str, Any] = {}
    for key, value in data.items():
        where = f"{path}.{key}"
        if key not in fields:
            if model.model_config.get("extra") != "forbid":  # a free-form part (kept as given): any key is known
                out[key] = value
            else:
                found.append(where)
            continue
        info = fields[key]
        inner = nested.get(where) or _model_in(info.annotation)
        if inner is None:
            out[key] = value
        elif isinstance(value, list):
            out[key] = [prune_unknown(inner, v, f"{where}[{i}]", nested, found) for i, v in enumerate(value)]
        elif isinstance(value, dict) and typing.get_origin(info.annotation) is dict and where not in nested:
            out[key] = {k: prune_unknown(inner, v, f"{where}.{k}", nested, found) for k, v in value.items()}
        else:
            out[key] = prune_unknown(inner, value, where, nested, found)
    return out


NESTED: dict[str, type[BaseModel]] = {"spec.job": JobSpec}  # RLJobSpec.job: a dict validated as a JobSpec
