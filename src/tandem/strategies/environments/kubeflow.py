"""A Kubeflow PyTorchJob: one process per pod."""

from __future__ import annotations

import os

from tandem.strategies.environments.cluster_environment import ClusterEnvironment


class KubeflowEnvironment(ClusterEnvironment):
    """A Kubeflow PyTorchJob (v1): one process per pod, with ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and
    ``MASTER_PORT`` set by the operator and no ``LOCAL_RANK`` (Lightning's ``KubeflowEnvironment``). Several
    devices per pod: run torchrun inside the pod."""

    name = "kubeflow"
    variables = ("WORLD_SIZE", "RANK", None, "RANK")  # one process per pod: the node rank is the rank
    shape_hint = (
        "A Kubeflow PyTorchJob runs one process per pod: use devices=1 and num_nodes=<the number of pods>; for "
        "several devices per pod, run torchrun inside each pod (then devices=<processes per pod>)."
    )

    @classmethod
    def detect(cls) -> bool:
        in_kubernetes = "KUBERNETES_SERVICE_HOST" in os.environ or "KUBERNETES_PORT" in os.environ
        required = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
        return in_kubernetes and all(v in os.environ for v in required) and "LOCAL_RANK" not in os.environ

    @property
    def local_rank(self) -> int:
        return 0
