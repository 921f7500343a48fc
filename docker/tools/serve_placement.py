"""Prints where Serve's replicas run, per deployment, as JSON, from inside
the head container (its dashboard at 127.0.0.1:8265):

    docker exec -i <head> argus-agent ray-tool python < docker/tools/serve_placement.py

`ray-tool python` runs it as the Ray user, confined, with Python isolated,
and gives Ray's client the cluster's token. Output (one line):
    {"deployments": [{"app", "deployment", "target", "states": {state: n},
                      "nodes": {node_ip: running replicas}}, ...],
     "spread": bool}
"spread" is true when every deployment with two or more replicas runs them
all, on at least two nodes (R-SERVE-8; the caller knows whether two
workers are up). Exit 1 with a one-line message when the dashboard does not
answer.
"""

import json
import sys


def main():
    from ray.dashboard.modules.serve.sdk import ServeSubmissionClient

    try:
        details = ServeSubmissionClient("http://127.0.0.1:8265").get_serve_details()
    except Exception as e:  # the caller retries; say why in one line
        sys.exit(f"serve_placement: the dashboard did not answer: {type(e).__name__}: {e}")
    out, spread = [], True
    for app_name, app in sorted((details.get("applications") or {}).items()):
        for dep_name, dep in sorted((app.get("deployments") or {}).items()):
            target = (dep.get("target_num_replicas")
                      or (dep.get("deployment_config") or {}).get("num_replicas") or 0)
            states, nodes = {}, {}
            for r in dep.get("replicas") or []:
                states[r["state"]] = states.get(r["state"], 0) + 1
                if r["state"] == "RUNNING":
                    ip = r.get("node_ip") or r.get("node_id") or "?"
                    nodes[ip] = nodes.get(ip, 0) + 1
            if target >= 2 and (len(nodes) < 2 or states != {"RUNNING": target}):
                spread = False
            out.append({"app": app_name, "deployment": dep_name, "target": target,
                        "states": states, "nodes": nodes})
    print(json.dumps({"deployments": out, "spread": spread}))


if __name__ == "__main__":
    main()
