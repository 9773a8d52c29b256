"""LSF's job: ranks from jsrun's variables, hosts from its rank file."""

from __future__ import annotations

import os

from tandem.strategies.environments.cluster_environment import ClusterEnvironment
from tandem.utilities.exceptions import TandemConfigError


class LSFEnvironment(ClusterEnvironment):
    """Processes started by LSF's ``jsrun`` (Lightning's ``LSFEnvironment``)."""

    name = "lsf"
    variables = ("JSM_NAMESPACE_SIZE", "JSM_NAMESPACE_RANK", "JSM_NAMESPACE_LOCAL_RANK", None)

    @classmethod
    def detect(cls) -> bool:
        required = ("LSB_JOBID", "LSB_DJOB_RANKFILE", "JSM_NAMESPACE_LOCAL_RANK", "JSM_NAMESPACE_SIZE")
        return all(v in os.environ for v in required)

    @property
    def node_rank(self) -> int:
        hosts = self._rank_hosts()
        return list(dict.fromkeys(hosts)).index(hosts[self.global_rank])

    def _default_address(self) -> str:
        return self._rank_hosts()[0]

    def _default_port(self) -> int:
        job_id = os.environ["LSB_JOBID"]
        return 10000 + int(job_id) % 1000 if job_id.isdigit() else 12910  # Lightning's rule

    def _rank_hosts(self) -> list[str]:
        """The host of each rank: the rank file's lines after the first (the launch node)."""
        path = os.environ["LSB_DJOB_RANKFILE"]
        try:
            with open(path) as file:
                hosts = [line.strip() for line in file if line.strip()][1:]
        except OSError as error:
            raise TandemConfigError(f"LSF: cannot read LSB_DJOB_RANKFILE={path!r}: {error.strerror}.") from error
        if len(hosts) < self.world_size:
            raise TandemConfigError(
                f"LSF: LSB_DJOB_RANKFILE={path!r} names {len(hosts)} rank host(s) after the launch node, but "
                f"JSM_NAMESPACE_SIZE is {self.world_size}: start the job with jsrun, one rank per line."
            )
        return hosts
