"""The operator's image defaults for roles whose RLJob names no image.

A role's image is roles.<role>.image, else spec.image, else the operator's default (`ImageDefaults`,
from the environment the chart sets: SCALERL_DEFAULT_IMAGE, SCALERL_DEFAULT_IMAGE_PULL_POLICY,
SCALERL_DEFAULT_IMAGE_PULL_SECRETS). The defaults a job's children were first created with are recorded
on them (annotation `scalerl.dev/image-defaults`) and kept (`pinned_image_defaults`): upgrading the
operator to a new image does not roll running jobs.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from scalerl_operator.api.spec import RLJobSpec
from scalerl_operator.render.names import ROLES

IMAGE_DEFAULTS_ANNOTATION = "scalerl.dev/image-defaults"
IMAGE_ENV, PULL_POLICY_ENV, PULL_SECRETS_ENV = ("SCALERL_DEFAULT_IMAGE", "SCALERL_DEFAULT_IMAGE_PULL_POLICY",
                                                "SCALERL_DEFAULT_IMAGE_PULL_SECRETS")
PULL_POLICIES = ("Always", "IfNotPresent", "Never")


@dataclass(frozen=True)
class ImageDefaults:
    """The operator's image defaults for roles whose RLJob names none (the chart's image values)."""

    image: str = ""
    pull_policy: str = "IfNotPresent"
    pull_secrets: tuple[str, ...] = ()

    def annotation(self) -> str:
        return json.dumps({"image": self.image, "pullPolicy": self.pull_policy, "pullSecrets": list(self.pull_secrets)},
                          sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_annotation(cls, text: str) -> ImageDefaults | None:
        try:
            d = json.loads(text)
            out = cls(str(d["image"]), str(d["pullPolicy"]), tuple(str(s) for s in d["pullSecrets"]))
        except (ValueError, KeyError, TypeError):
            return None
        return out if out.pull_policy in PULL_POLICIES else None


def image_defaults(environ: Mapping[str, str]) -> ImageDefaults:
    """The operator's defaults from its environment; ValueError names the variable when one is bad."""
    policy = environ.get(PULL_POLICY_ENV) or "IfNotPresent"
    if policy not in PULL_POLICIES:
        raise ValueError(f"{PULL_POLICY_ENV}: must be one of {', '.join(PULL_POLICIES)} (got {policy!r})")
    image = environ.get(IMAGE_ENV, "").strip()
    if any(c.isspace() for c in image) or len(image) > 512:
        raise ValueError(f"{IMAGE_ENV}: must be an image reference such as registry/scalerl:1.2.3 (got {image!r})")
    secrets = tuple(s.strip() for s in environ.get(PULL_SECRETS_ENV, "").split(",") if s.strip())
    return ImageDefaults(image, policy, secrets)


def pinned_image_defaults(live: Mapping[str, dict[str, Any] | None], current: ImageDefaults) -> ImageDefaults:
    """The image defaults recorded on the job's existing workloads (the learner's first), else `current`."""
    for role in ("learner", "generator", "verifier", "curriculum"):
        text = (((live.get(role) or {}).get("metadata") or {}).get("annotations") or {}).get(IMAGE_DEFAULTS_ANNOTATION)
        if text and (pinned := ImageDefaults.from_annotation(text)) is not None:
            return pinned
    return current


def image_problem(spec: RLJobSpec, images: ImageDefaults) -> str | None:
    """One line naming the field when a role has no image at all, else None."""
    if spec.image or images.image:
        return None
    if missing := [r for r in ROLES if not getattr(spec.roles, r).image]:
        return (f"spec.image: no image for {', '.join(missing)}: set spec.image (or roles.<role>.image), or the "
                f"operator's default ({IMAGE_ENV}; the chart's image.repository and image.tag)")
    return None
