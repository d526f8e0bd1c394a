"""The fake Nodes of the Pod-running test cluster (scripts/infra/cluster.sh), as a JSON list on stdout.

Usage: python3 fake_nodes.py ANNOTATION_KEY ANNOTATION_VALUE

Two GPU nodes as an 8-GPU H100 machine registers itself with the NVIDIA GPU operator installed
(`nvidia.com/gpu` capacity from the device plugin, the feature-discovery labels, the taint GPU node pools
usually carry) and one CPU-only node. kwok manages the nodes carrying the annotation; the label
`scalerl.dev/fake-node` lets the infra scripts and tests find them. Standard library only: up.sh runs
this with the system's python3.
"""

from __future__ import annotations

import json
import sys

GPU_NODES = 2
GPUS_PER_NODE = 8
GPU_PRODUCT = "NVIDIA-H100-80GB-HBM3"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


def node(name: str, annotation: tuple[str, str], *, cpu: str, memory: str, gpus: int) -> dict[str, object]:
    labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
              "node.kubernetes.io/instance-type": "gpu-8x-h100" if gpus else "cpu-32", "type": "kwok",
              "scalerl.dev/fake-node": "gpu" if gpus else "cpu"}
    capacity = {"cpu": cpu, "memory": memory, "pods": "110", "ephemeral-storage": "1Ti"}
    spec: dict[str, object] = {}
    if gpus:
        labels.update({"nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": GPU_PRODUCT,
                       "nvidia.com/gpu.count": str(gpus), "nvidia.com/gpu.memory": "81559"})
        capacity["nvidia.com/gpu"] = str(gpus)
        spec["taints"] = [GPU_TAINT]
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": labels, "annotations": {annotation[0]: annotation[1]}},
            "spec": spec,
            "status": {"capacity": capacity, "allocatable": dict(capacity),
                       "nodeInfo": {"architecture": "amd64", "operatingSystem": "linux",
                                    "kubeletVersion": "fake", "containerRuntimeVersion": "kwok"}}}


def nodes(annotation: tuple[str, str]) -> list[dict[str, object]]:
    out = [node(f"gpu-node-{i}", annotation, cpu="96", memory="1024Gi", gpus=GPUS_PER_NODE) for i in range(GPU_NODES)]
    out.append(node("cpu-node-0", annotation, cpu="32", memory="128Gi", gpus=0))
    return out


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: fake_nodes.py ANNOTATION_KEY ANNOTATION_VALUE")
    json.dump(nodes((sys.argv[1], sys.argv[2])), sys.stdout, indent=1)
