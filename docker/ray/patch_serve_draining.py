#!/usr/bin/env python
"""Makes Ray 2.53's Serve see drained nodes, and keep a draining node's
proxy while it still holds replicas. Applied to the installed Ray at the
node image's build (Dockerfile.node), then tested there (``--test``).

Why (docs/serve.md "Taking a node out"):
1. Serve moves replicas off a node that Ray is draining (it starts a
   replacement elsewhere, then stops the old replica gracefully), but in Ray
   2.53 ``DefaultClusterNodeInfoCache.get_draining_nodes()`` returns ``{}``,
   so Serve never sees a drained node. Upstream fixed this after 2.53
   (ray-project/ray PR #65502) by asking the GCS; so does this patch: the
   cache reads the draining nodes from the GCS once per controller loop
   (``ray._private.state.state.get_draining_nodes()``, the call the fix
   uses) and returns them.
2. With drained nodes seen, the controller also removes a draining node
   from the proxy nodes at once (``ServeController._update_proxy_nodes``),
   even while its replicas are still being replaced; its proxy then fails
   its health check, and when that node is the only one serving, the load
   balancer has no server until the replacements run elsewhere. This patch
   keeps the proxy of a node that still holds replicas (Serve's own
   ``get_active_node_ids`` counts replicas pending migration); once they
   are gone, the proxy drains and stops as upstream's does.

    python patch_serve_draining.py            # patch the installed Ray
    python patch_serve_draining.py --test     # check the patched behaviour

Both fail, naming the file, when Ray's source is not the expected one.
"""

import argparse
import os
import sys
import types

MARK = "# argus: patch_serve_draining"

PATCHES = {
    "serve/_private/cluster_node_info_cache.py": [
        (
            """        self._cached_available_resources_per_node = (
            ray._private.state.available_resources_per_node()
        )
""",
            """        self._cached_available_resources_per_node = (
            ray._private.state.available_resources_per_node()
        )
        %s (ray-project/ray PR #65502)
        self._argus_draining_nodes = ray._private.state.state.get_draining_nodes()
"""
            % MARK,
        ),
        (
            """class DefaultClusterNodeInfoCache(ClusterNodeInfoCache):
    def __init__(self, gcs_client: GcsClient):
        super().__init__(gcs_client)

    def get_draining_nodes(self) -> Dict[str, int]:
        return dict()
""",
            """class DefaultClusterNodeInfoCache(ClusterNodeInfoCache):
    def __init__(self, gcs_client: GcsClient):
        super().__init__(gcs_client)

    def get_draining_nodes(self) -> Dict[str, int]:
        %s: the nodes the GCS drains, as of the last update()
        return dict(getattr(self, "_argus_draining_nodes", None) or {})
"""
            % MARK,
        ),
    ],
    "serve/_private/controller.py": [
        (
            """        new_proxy_nodes = self.deployment_state_manager.get_active_node_ids()
        new_proxy_nodes = new_proxy_nodes - set(
            self.cluster_node_info_cache.get_draining_nodes()
        )
""",
            """        new_proxy_nodes = self.deployment_state_manager.get_active_node_ids()
        %s: a draining node keeps its proxy while it holds
        # replicas (active node ids count those pending migration), so the
        # load balancer keeps a server until the replacements run elsewhere.
"""
            % MARK,
        ),
    ],
}


def ray_root():
    import ray

    return os.path.dirname(ray.__file__)


def apply():
    root = ray_root()
    for rel, subs in PATCHES.items():
        path = os.path.join(root, rel)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        if MARK in text:
            print(f"patch_serve_draining: {rel} already patched")
            continue
        for old, new in subs:
            n = text.count(old)
            if n != 1:
                sys.exit(f"patch_serve_draining: {path}: expected source found {n} times, not once "
                         f"(not Ray 2.53.0's?):\n{old}")
            text = text.replace(old, new)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        # Stale bytecode would run the unpatched code.
        cache = os.path.join(os.path.dirname(path), "__pycache__")
        base = os.path.splitext(os.path.basename(path))[0] + "."
        for name in os.listdir(cache) if os.path.isdir(cache) else []:
            if name.startswith(base):
                os.remove(os.path.join(cache, name))
        print(f"patch_serve_draining: patched {rel}")


def test():
    """Exercises the patched code with stand-ins for the GCS."""
    import ray._private.state as state
    from ray.serve._private.cluster_node_info_cache import DefaultClusterNodeInfoCache
    from ray.serve._private.controller import ServeController

    class Gcs:
        def get_all_node_info(self, timeout=None):
            return {}

    draining = {"a" * 56: 1234}
    saved = (state.available_resources_per_node, state.state.get_draining_nodes)
    state.available_resources_per_node = lambda: {}
    state.state.get_draining_nodes = lambda: dict(draining)
    try:
        cache = DefaultClusterNodeInfoCache(Gcs())
        assert cache.get_draining_nodes() == {}, "no update yet: nothing draining"
        cache.update()
        got = cache.get_draining_nodes()
        assert got == draining, f"the cache does not report the GCS's draining nodes: {got}"
    finally:
        state.available_resources_per_node, state.state.get_draining_nodes = saved

    fake = types.SimpleNamespace(
        deployment_state_manager=types.SimpleNamespace(get_active_node_ids=lambda: {"w1", "w2"}),
        cluster_node_info_cache=types.SimpleNamespace(get_draining_nodes=lambda: {"w2": 1}),
        _controller_node_id="head",
    )
    ServeController._update_proxy_nodes(fake)
    assert fake._proxy_nodes == {"w1", "w2", "head"}, (
        f"a draining node with replicas lost its proxy: {fake._proxy_nodes}")
    fake.deployment_state_manager.get_active_node_ids = lambda: {"w1"}
    ServeController._update_proxy_nodes(fake)
    assert fake._proxy_nodes == {"w1", "head"}, (
        f"a node without replicas kept its proxy: {fake._proxy_nodes}")
    print("patch_serve_draining: Serve sees drained nodes; a draining node keeps its proxy "
          "while it holds replicas")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--test", action="store_true", help="check the patched behaviour")
    a = p.parse_args()
    if a.test:
        test()
    else:
        apply()


if __name__ == "__main__":
    main()
