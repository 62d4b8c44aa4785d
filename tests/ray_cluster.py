"""A Ray cluster of two nodes on this machine, bound to loopback, for the cluster tests.

    python tests/ray_cluster.py [SECONDS]   # prints the head's address, then holds the cluster

The head has 2 CPUs and the second node 1, each its own raylet with its own resources, as
``ray start --head`` plus ``ray start --address`` would make them. ``ray start`` binds a node to
the host's network address; ``ray.cluster_utils.Cluster`` with Ray's local-only switch keeps every
node on 127.0.0.1, so the test talks to no address but loopback.
"""

import os
import sys
import time

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"

from ray.cluster_utils import Cluster  # noqa: E402

if __name__ == "__main__":
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    print(cluster.address, flush=True)
    try:
        time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 900)
    finally:
        cluster.shutdown()
