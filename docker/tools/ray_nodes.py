"""Prints this Ray cluster's nodes as JSON, from inside a node container.

Run it in the head:  docker exec -i <head> python - < docker/tools/ray_nodes.py
Output: {"address": "ip:port", "alive": N, "nodes": [{"ip", "alive", "id",
"resources"}...]}. The GCS address comes from the discovery record
(ARGUS_HEAD_IP_FILE or its default under ARGUS_SHARED_ROOT), falling back to
this container's own IP and ARGUS_RAY_PORT. Exit 1 with a message on error.
"""

import json
import os
import socket
import sys


def gcs_address():
    root = os.environ.get("ARGUS_SHARED_ROOT", "/private")
    cluster = os.environ.get("ARGUS_CLUSTER_NAME", "argus-ray")
    path = os.environ.get(
        "ARGUS_HEAD_IP_FILE", f"{root}/ray/discovery/{cluster}/head.json"
    )
    try:
        with open(path) as f:
            rec = json.load(f)
        if rec.get("head_ip") and rec.get("gcs_port"):
            return f"{rec['head_ip']}:{rec['gcs_port']}"
    except (OSError, ValueError):
        pass
    ip = socket.gethostbyname(socket.gethostname())
    return f"{ip}:{os.environ.get('ARGUS_RAY_PORT', '6379')}"


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
