"""Prints this Ray cluster's nodes as JSON, from inside the head container.

Run it in the head:  docker exec -i <head> python - < docker/tools/ray_nodes.py
Output: {"address": "ip:port", "alive": N, "nodes": [{"ip", "alive", "id",
"resources"}...]}. The GCS is this container's own (its IP, ARGUS_RAY_PORT);
the port is probed first so a missing GCS fails in seconds, not after Ray's
connection timeout. Exit 1 with a one-line message on error.
"""

import json
import os
import socket
import sys


def gcs_address():
    ip = socket.gethostbyname(socket.gethostname())
    port = int(os.environ.get("ARGUS_RAY_PORT", "6379"))
    socket.create_connection((ip, port), timeout=3).close()
    return f"{ip}:{port}"


def main():
    import ray

    address = gcs_address()
    ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    nodes = [
        {
            "ip": n["NodeManagerAddress"],
            "alive": n["Alive"],
            "id": n["NodeID"],
            "resources": n.get("Resources", {}),
        }
        for n in ray.nodes()
    ]
    ray.shutdown()
    print(
        json.dumps(
            {
                "address": address,
                "alive": sum(1 for n in nodes if n["alive"]),
                "nodes": nodes,
            }
        )
    )


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # one line for the callers' logs
        print(f"ray_nodes: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
