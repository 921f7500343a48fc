#!/usr/bin/env python
"""Patches Ray 2.53's Serve controller: drained nodes seen, proxies killed
after a GCS restart, and start-first upgrades. Applied to the installed Ray at the node image's build
(Dockerfile.node; the controller runs on the head), then tested there
(``--test``).

Draining (docs/serve.md "Taking a node out"):
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

A proxy's kill after a GCS restart:
4. A GCS restarted with fault tolerance (the head's container restarted
   with Redis) restores the actors that were alive but not the raylet each
   runs on, so a later ``ray.kill`` marks the actor DEAD and kills nothing
   (ray-project/ray#63763, fixed after 2.53 by PR #63764; the node agent's
   reaper kills such workers within 30 s). For a proxy that is not enough:
   the old process keeps listening on the node's HTTP port, which Serve
   binds with SO_REUSEPORT, so when Serve starts a new proxy on that node
   (replicas placed there again) the two share the port, and every request
   the old one takes fails with a 500 (its replica reads the body by
   calling back the proxy of that name: the new one, which does not know
   the request). This patch has the controller's kill also call the proxy's
   own exit, over the actor's direct channel, before ``ray.kill``.

Start-first upgrades (docs/serve.md "Upgrading an endpoint"):
3. A change that restarts replicas (engine image, code, args, actor options)
   rolls stop-first in Ray 2.53: ``_check_and_stop_outdated_version_replicas``
   stops max(1, 20 %) of the old replicas, and only then does
   ``scale_deployment_replicas`` start as many new ones, so a one-replica
   endpoint answers nothing for a whole cold start (requests wait in the
   proxies). Upstream's start-before-stop (``max_surge_percent``) is an
   unmerged draft (ray-project/ray PR #66267). This patch rolls start-first:
   up to max(1, 20 %) new replicas start beyond the target, and an old
   replica that serves stops only when a new one runs in its place. Old
   replicas still starting stop at once; a scale-down during an upgrade and
   lightweight (reconfigure-only) updates keep upstream's behaviour. When
   the new replica cannot start (no room beside the old ones: no free GPU),
   the upgrade waits, Serve's status says which resources it waits for, and
   the controller logs it; with ``ARGUS_SERVE_STOP_FIRST_AFTER_S`` set in
   the head's environment, an upgrade whose new replica has not run for
   that many seconds falls back to stop-first for that step.

    python patch_serve.py            # patch the installed Ray
    python patch_serve.py --test     # check the patched behaviour

Both fail, naming the file, when Ray's source is not the expected one.
"""

import argparse
import os
import sys
import types

MARK = "# argus: patch_serve"

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
    "serve/_private/deployment_state.py": [
        (
            """class ReplicaStateContainer:
""",
            """%s: start-first upgrades. Pure decisions; the
# DeploymentState methods below apply them.
def _argus_start_first(target, old_restart, old_active):
    \"\"\"Whether an update rolls start-first: replicas of an old version must
    restart, and the deployment is not scaling down past them (upstream's
    rules then: scale down first).\"\"\"
    return target > 0 and old_restart > 0 and old_active <= target


def _argus_surge_delta(target, current, recovering, new_active):
    \"\"\"Replicas to start in a start-first update: up to the target in the
    new version, at most max(1, 20 %%) beyond the target at once; never
    negative (the extra replicas are old ones, stopped as new ones run).\"\"\"
    rollout = max(int(0.2 * target), 1)
    return max(
        0,
        min(target - new_active - recovering, target + rollout - current - recovering),
    )


def _argus_stop_budget(target, new_running, old_serving):
    \"\"\"Serving old replicas that may stop now: those beyond the target,
    counting the new version's running replicas.\"\"\"
    return max(0, new_running + old_serving - target)


def _argus_spread_backoff(fails):
    \"\"\"Seconds to wait before the next spread move after `fails` moves in a
    row that did not move anything (the new replica landed on the crowded
    node, or did not start): short at first (a node just back is often not
    yet in Ray's view of free resources), doubling to at most 5 minutes
    (each try may cost a cold start).\"\"\"
    return min(15 * 2 ** min(fails, 5), 300)


def _argus_spread_source(counts, fits):
    \"\"\"The node to move one replica away from, or None: the node holding
    most of a deployment's replicas (`counts`: node -> replicas), when a node
    with room for one more (`fits`) holds at least two fewer.\"\"\"
    if not counts:
        return None
    src = max(sorted(counts), key=lambda n: counts[n])
    if any(n != src and counts.get(n, 0) <= counts[src] - 2 for n in fits):
        return src
    return None


class ReplicaStateContainer:
"""
            % MARK,
        ),
        (
            """    def _stop_or_update_outdated_version_replicas(self, max_to_stop=math.inf) -> bool:
""",
            """    def _stop_or_update_outdated_version_replicas(
        self, max_to_stop=math.inf, max_serving_stops=math.inf
    ) -> bool:  %s: max_serving_stops bounds the old replicas that serve
"""
            % MARK,
        ),
        (
            """        reconfigure_changes = 0
        for replica in replicas_to_update:
            if (code_version_changes + reconfigure_changes) >= max_to_stop:
                self._replicas.add(replica.actor_details.state, replica)
""",
            """        reconfigure_changes = 0
        serving_stops = 0
        for replica in replicas_to_update:
            if (code_version_changes + reconfigure_changes) >= max_to_stop:
                self._replicas.add(replica.actor_details.state, replica)
            elif (
                replica.actor_details.state != ReplicaState.STARTING
                and serving_stops >= max_serving_stops
                and replica.version.requires_actor_restart(self._target_state.version)
            ):
                %s: start-first: it serves until a new one runs
                self._replicas.add(replica.actor_details.state, replica)
"""
            % MARK,
        ),
        (
            """                code_version_changes += 1
                # If the replica is still `STARTING`, we don't need to go through the
""",
            """                code_version_changes += 1
                serving_stops += replica.actor_details.state != ReplicaState.STARTING
                # If the replica is still `STARTING`, we don't need to go through the
""",
        ),
        (
            """        max_to_stop = max(rollout_size - pending_replicas, 0)

        return self._stop_or_update_outdated_version_replicas(max_to_stop)
""",
            """        max_to_stop = max(rollout_size - pending_replicas, 0)

        if self._argus_rolls_start_first():  %s
            old_serving = self._replicas.count(
                exclude_version=self._target_state.version,
                states=[
                    ReplicaState.UPDATING,
                    ReplicaState.RUNNING,
                    ReplicaState.PENDING_MIGRATION,
                ],
            )
            return self._stop_or_update_outdated_version_replicas(
                max_to_stop,
                _argus_stop_budget(
                    self._target_state.target_num_replicas,
                    new_running_replicas,
                    old_serving,
                ),
            )
        return self._stop_or_update_outdated_version_replicas(max_to_stop)

    def _argus_rolls_start_first(self) -> bool:
        %s: whether this step of an update rolls
        # start-first, and the log lines of one that waits for room.
        version = self._target_state.version
        target = self._target_state.target_num_replicas
        old = [
            r
            for r in self._replicas.get(
                states=[
                    ReplicaState.STARTING,
                    ReplicaState.UPDATING,
                    ReplicaState.RUNNING,
                    ReplicaState.PENDING_MIGRATION,
                ]
            )
            if r.version != version
        ]
        restart = sum(1 for r in old if r.version.requires_actor_restart(version))
        if not _argus_start_first(target, restart, len(old)):
            self._argus_wait = None
            return False
        new_running = self._replicas.count(version=version, states=[ReplicaState.RUNNING])
        now = time.time()
        wait = getattr(self, "_argus_wait", None)
        if wait is None or wait[0] != new_running:
            # (new replicas running, since, warned, fell back)
            wait = self._argus_wait = [new_running, now, False, False]
        waited = now - wait[1]
        raw = os.environ.get("ARGUS_SERVE_STOP_FIRST_AFTER_S") or "inf"
        try:
            after = float(raw)
        except ValueError:
            # The agent refuses such a value at start; a controller started
            # otherwise says so and waits for room.
            if not wait[2]:
                logger.warning(
                    f"argus: ARGUS_SERVE_STOP_FIRST_AFTER_S={raw!r} is not a number of "
                    "seconds; ignored (upgrades wait for room)."
                )
            after = math.inf
        if waited >= after:
            if not wait[3]:
                wait[3] = True
                logger.warning(
                    f"argus: the start-first upgrade of {self._id} has had no new "
                    f"replica running for {waited:.0f} s; stopping an old replica "
                    "first (ARGUS_SERVE_STOP_FIRST_AFTER_S)."
                )
            return False
        if waited >= 30 and not wait[2]:
            wait[2] = True
            logger.warning(
                f"argus: the start-first upgrade of {self._id} has waited {waited:.0f} s "
                "for a new replica to run beside the old ones (no room for it? "
                "`serve status` says which resources it waits for); the old replicas "
                "keep serving. Set ARGUS_SERVE_STOP_FIRST_AFTER_S on the head to stop "
                "an old replica first after that long."
            )
        return True

    def _argus_spread_step(self) -> int:
        %s: spreads a deployment again after a drain
        # or a roll moved its replicas together (Serve never moves a running
        # replica back). Start-first: one extra replica starts where the
        # scheduler finds fewest of this deployment's replicas, and once it
        # runs one replica of the crowded node stops. Returns the replicas
        # to start beyond the target (1 while a move is under way).
        import ray.serve._private.deployment_scheduler as sched

        now = time.time()
        target = self._target_state.target_num_replicas
        version = self._target_state.version
        move = getattr(self, "_argus_move", None)
        live = self._replicas.get(
            states=[
                ReplicaState.STARTING,
                ReplicaState.UPDATING,
                ReplicaState.RECOVERING,
                ReplicaState.RUNNING,
                ReplicaState.PENDING_MIGRATION,
            ]
        )
        running = [r for r in live if r.actor_details.state == ReplicaState.RUNNING]
        if move is not None:
            fresh = [r for r in live if r.replica_id.unique_id not in move["ids"]]
            if (
                len(live) != target + 1
                or len(fresh) != 1
                or any(r.version != version for r in live)
            ):
                # Scaled, upgraded or a replica died meanwhile: Serve's own
                # rules take over (an excess replica is scaled down).
                self._argus_move = None
                return 0
            new = fresh[0]
            if new.actor_details.state != ReplicaState.RUNNING:
                if now - move["at"] < 300:
                    return 1
                logger.warning(
                    f"argus: spreading {self._id}: the new replica did not start in "
                    "300 s; stopping it and trying again later."
                )
                victim = new
            elif new.actor_node_id == move["src"]:
                # Ray spilled it back onto the crowded node (the target's
                # room was not there after all, or not yet in Ray's view of
                # a node that just came back): undo, and try again later.
                logger.warning(
                    f"argus: spreading {self._id}: the new replica {new.replica_id} "
                    f"runs on the crowded node {move['src']} (Ray placed it there); "
                    "stopping it."
                )
                victim = new
            else:
                victim = next(
                    (r for r in running if r is not new and r.actor_node_id == move["src"]),
                    None,
                )
            self._argus_move = None
            if victim is not new and victim is not None:
                logger.info(
                    f"argus: spreading {self._id}: {new.replica_id} runs on node "
                    f"{new.actor_node_id}; stopping {victim.replica_id} on {move['src']}."
                )
                self._argus_spread_fails = 0
            else:
                fails = getattr(self, "_argus_spread_fails", 0)
                self._argus_spread_fails = fails + 1
                wait = _argus_spread_backoff(fails)
                self._argus_spread_after = now + wait
                logger.info(f"argus: spreading {self._id}: next try in {wait} s.")
            if victim is not None:
                state = victim.actor_details.state
                for r in self._replicas.pop(states=[state]):
                    if r is victim:
                        self._stop_replica(r, graceful_stop=state == ReplicaState.RUNNING)
                    else:
                        self._replicas.add(state, r)
            return 0
        if (
            target < 2
            or len(live) != target
            or len(running) != target
            or any(r.version != version for r in live)
            or self._replicas.count(states=[ReplicaState.STOPPING]) > 0
            or now < getattr(self, "_argus_spread_after", 0)
            or sched.RAY_SERVE_USE_PACK_SCHEDULING_STRATEGY
            or self._target_state.info.replica_config.placement_group_bundles
        ):
            return 0
        counts = {}
        for r in running:
            counts[r.actor_node_id] = counts.get(r.actor_node_id, 0) + 1
        fits = self._deployment_scheduler.argus_nodes_with_room(self._id)
        src = _argus_spread_source(counts, fits)
        if src is None:
            return 0
        logger.info(
            f"argus: spreading {self._id}: {counts[src]} of its {target} replicas run "
            f"on node {src}; starting one elsewhere before stopping one there."
        )
        self._argus_move = {"src": src, "at": now, "ids": {r.replica_id.unique_id for r in live}}
        return 1
"""
            % (MARK, MARK, MARK),
        ),
        (
            """        self._check_and_stop_outdated_version_replicas()

        current_replicas = self._replicas.count(
""",
            """        self._check_and_stop_outdated_version_replicas()
        argus_extra = self._argus_spread_step()  %s

        current_replicas = self._replicas.count(
"""
            % MARK,
        ),
        (
            """        delta_replicas = (
            self._target_state.target_num_replicas
            - current_replicas
            - recovering_replicas
        )
        if delta_replicas == 0:
""",
            """        delta_replicas = (
            self._target_state.target_num_replicas
            - current_replicas
            - recovering_replicas
        )
        if self._argus_rolls_start_first():  %s
            delta_replicas = _argus_surge_delta(
                self._target_state.target_num_replicas,
                current_replicas,
                recovering_replicas,
                self._replicas.count(
                    version=self._target_state.version,
                    states=[
                        ReplicaState.STARTING,
                        ReplicaState.UPDATING,
                        ReplicaState.RUNNING,
                    ],
                ),
            )
        else:
            delta_replicas += argus_extra
        if delta_replicas == 0:
"""
            % MARK,
        ),
    ],
    "serve/_private/deployment_scheduler.py": [
        (
            """class DeploymentScheduler(ABC):
""",
            """%s: spread. Pure decision; the scheduler applies it.
def _argus_fewest(counts, fits, load=None):
    \"\"\"The node of `fits` (nodes with room for one more replica) holding
    fewest of the deployment's replicas (`counts`: node -> replicas, running
    and launching), then fewest replicas of all deployments (`load`), or
    None.\"\"\"
    if not fits:
        return None
    load = load or {}
    return min(sorted(fits), key=lambda n: (counts.get(n, 0), load.get(n, 0)))


class DeploymentScheduler(ABC):
"""
            % MARK,
        ),
        (
            """    def _get_available_resources_per_node(self) -> Dict[str, Resources]:
""",
            """    def argus_nodes_with_room(self, deployment_id: DeploymentID) -> List[str]:
        %s: the active nodes where one more replica of the
        # deployment fits now (resources; not placement-group bundles).
        need = self._deployments[deployment_id].required_resources
        return [
            n for n, r in self._get_available_resources_per_node().items() if r.can_fit(need)
        ]

    def argus_spread_target(self, request: ReplicaSchedulingRequest) -> Optional[str]:
        %s: where a new replica goes: the node with room
        # that holds fewest replicas of its deployment (a soft target: Ray
        # places it elsewhere when that node cannot take it). None for
        # replicas with placement groups (their strategy decides).
        if request.placement_group_bundles is not None:
            return None
        deployment_id = request.replica_id.deployment_id
        counts, load = defaultdict(int), defaultdict(int)
        for d, running in self._running_replicas.items():
            for node_id in running.values():
                counts[node_id] += d == deployment_id
                load[node_id] += 1
        for d, launching in self._launching_replicas.items():
            for info in launching.values():
                if info.target_node_id:
                    counts[info.target_node_id] += d == deployment_id
                    load[info.target_node_id] += 1
        return _argus_fewest(counts, self.argus_nodes_with_room(deployment_id), load)

    def _get_available_resources_per_node(self) -> Dict[str, Resources]:
"""
            % (MARK, MARK),
        ),
        (
            """                for scheduling_request in list(pending_replicas.values()):
                    self._schedule_replica(
                        scheduling_request=scheduling_request,
                        default_scheduling_strategy="SPREAD",
                    )
""",
            """                for scheduling_request in list(pending_replicas.values()):
                    self._schedule_replica(
                        scheduling_request=scheduling_request,
                        default_scheduling_strategy="SPREAD",
                        target_node_id=self.argus_spread_target(scheduling_request),  %s
                    )
"""
            % MARK,
        ),
    ],
    "serve/_private/proxy.py": [
        (
            """    def pong(self):
        \"\"\"Called by the replica to initialize its handle to the proxy.\"\"\"
        pass
""",
            """    def pong(self):
        \"\"\"Called by the replica to initialize its handle to the proxy.\"\"\"
        pass

    def argus_exit(self):
        \"\"\"%s: the controller's kill, delivered by the proxy itself
        (ray-project/ray#63763: after a GCS restart, ``ray.kill`` of an actor
        the GCS restored never reaches its node).\"\"\"
        os._exit(0)
"""
            % MARK,
        ),
    ],
    "serve/_private/proxy_state.py": [
        (
            """    def kill(self):
        \"\"\"Kill the proxy actor.\"\"\"
        ray.kill(self._actor_handle, no_restart=True)
""",
            """    def kill(self):
        \"\"\"Kill the proxy actor.\"\"\"
        %s (ray-project/ray#63763): a GCS restarted with fault
        # tolerance no longer knows the node of a proxy started before the
        # restart, so its ray.kill marks the proxy DEAD and frees its name but
        # kills nothing; the old process keeps listening on the node's HTTP
        # port beside the next proxy there (SO_REUSEPORT), and the requests it
        # takes fail: their replicas call back the proxy of that name, the new
        # one, which does not know them. The exit call goes to the proxy
        # directly, not through the GCS.
        try:
            self._actor_handle.argus_exit.remote()
        except Exception:
            pass
        ray.kill(self._actor_handle, no_restart=True)
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
            print(f"patch_serve: {rel} already patched")
            continue
        for old, new in subs:
            n = text.count(old)
            if n != 1:
                sys.exit(f"patch_serve: {path}: expected source found {n} times, not once "
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
        print(f"patch_serve: patched {rel}")


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
    print("patch_serve: Serve sees drained nodes; a draining node keeps its proxy "
          "while it holds replicas")
    test_start_first()
    test_spread()
    test_proxy_kill()


def test_proxy_kill():
    """The controller's kill of a proxy asks the proxy to exit first, over
    the actor's own channel, then kills it through the GCS; a handle that
    cannot take the call (an older proxy) is still killed."""
    import ray
    from ray.serve._private import proxy_state
    from ray.serve._private.proxy import ProxyActor

    assert callable(getattr(ProxyActor, "argus_exit", None)), "the proxy's exit not patched in"
    calls = []

    class Method:
        def __init__(self, name):
            self.name = name

        def remote(self, *args):
            calls.append(self.name)

    class Handle:
        argus_exit = Method("argus_exit")

    class OldHandle:
        @property
        def argus_exit(self):
            raise AttributeError("argus_exit")

    saved = ray.kill
    ray.kill = lambda h, no_restart=True: calls.append(("ray.kill", type(h).__name__, no_restart))
    try:
        for handle in (Handle(), OldHandle()):
            w = proxy_state.ActorProxyWrapper.__new__(proxy_state.ActorProxyWrapper)
            w._actor_handle = handle
            w.kill()
    finally:
        ray.kill = saved
    assert calls == ["argus_exit", ("ray.kill", "Handle", True), ("ray.kill", "OldHandle", True)], calls
    print("patch_serve: a proxy's kill reaches the proxy itself, then the GCS")


def roll(ds, target, old, starts=True, steps=60):
    """Rolls `old` replicas of version 0 to `target` of version 1 with the
    patched decisions, as the controller's loop applies them (a step: stop
    what the budget allows, start what the delta says, then replicas that
    were starting run (when `starts`) and stopping ones go). Returns each
    step's running count and the final replicas."""
    reps = [[0, "RUNNING"] for _ in range(old)]
    served = []
    for _ in range(steps):
        olds = [r for r in reps if r[0] == 0 and r[1] in ("STARTING", "RUNNING")]
        if ds._argus_start_first(target, len(olds), len(olds)):
            new_running = sum(1 for r in reps if r == [1, "RUNNING"])
            budget = ds._argus_stop_budget(
                target, new_running, sum(1 for r in olds if r[1] == "RUNNING"))
            for r in olds:
                if r[1] == "STARTING":
                    r[1] = "STOPPING"
                elif budget > 0:
                    r[1], budget = "STOPPING", budget - 1
            current = sum(1 for r in reps if r[1] in ("STARTING", "RUNNING"))
            new_active = sum(1 for r in reps if r[0] == 1 and r[1] in ("STARTING", "RUNNING"))
            reps += [[1, "STARTING"] for _ in range(ds._argus_surge_delta(target, current, 0, new_active))]
        reps = [r for r in reps if r[1] != "STOPPING"]
        if starts:
            for r in reps:
                r[1] = "RUNNING" if r[1] == "STARTING" else r[1]
        served.append(sum(1 for r in reps if r[1] == "RUNNING"))
    return served, reps


def test_start_first():
    """The start-first decisions: no step serves fewer replicas than the
    target, at most max(1, 20 %) extra run at once, and the roll ends with
    the target in the new version; with no room for a new replica the old
    ones keep serving."""
    from ray.serve._private import deployment_state as ds
    from ray.serve._private.deployment_state import DeploymentState

    assert hasattr(DeploymentState, "_argus_rolls_start_first"), "start-first not patched in"
    assert ds._argus_start_first(1, 1, 1) and not ds._argus_start_first(0, 1, 1)
    assert not ds._argus_start_first(2, 0, 2), "a reconfigure-only update is upstream's"
    assert not ds._argus_start_first(2, 3, 3), "a scale-down during an update is upstream's"
    assert ds._argus_surge_delta(1, 1, 0, 0) == 1, "a one-replica upgrade starts its new replica first"
    assert ds._argus_stop_budget(1, 0, 1) == 0, "the old replica stopped before the new one ran"
    assert ds._argus_stop_budget(1, 1, 1) == 1
    for target in (1, 2, 4, 5, 10):
        served, reps = roll(ds, target, target)
        rollout = max(int(0.2 * target), 1)
        assert min(served) >= target, f"{target} replicas: a step served {min(served)}: {served}"
        assert max(served) <= target + rollout, f"{target} replicas: {max(served)} ran at once"
        assert sorted(reps) == [[1, "RUNNING"]] * target, f"{target} replicas: ended as {reps}"
        served, reps = roll(ds, target, target, starts=False)
        assert min(served) == target and all(r[0] == 0 for r in reps if r[1] == "RUNNING"), (
            f"{target} replicas, no room for a new one: {served}, {reps}")
    # Scaling up during the upgrade (2 old, target 3) ends at 3 new.
    served, reps = roll(ds, 3, 2)
    assert min(served) >= 2 and sorted(reps) == [[1, "RUNNING"]] * 3, (served, reps)
    print("patch_serve: upgrades roll start-first: 1, 2, 4, 5 and 10 replicas never serve "
          "fewer than their target; with no room the old replicas keep serving")


def test_spread():
    """The spread decisions: a move starts from the node holding most of a
    deployment's replicas only when a node with room holds two fewer, goes
    to the node with room holding fewest, and moves end with the replicas
    even (at most one apart) over the nodes with room."""
    from ray.serve._private import deployment_scheduler as sc
    from ray.serve._private import deployment_state as ds
    from ray.serve._private.deployment_scheduler import DeploymentScheduler
    from ray.serve._private.deployment_state import DeploymentState

    assert hasattr(DeploymentState, "_argus_spread_step"), "spread not patched in"
    assert hasattr(DeploymentScheduler, "argus_spread_target"), "spread not patched in"
    assert ds._argus_spread_source({"a": 4}, ["a", "b"]) == "a"
    assert ds._argus_spread_source({"a": 3, "b": 1}, ["a", "b"]) == "a"
    assert ds._argus_spread_source({"a": 2, "b": 2}, ["a", "b"]) is None
    assert ds._argus_spread_source({"a": 3, "b": 2}, ["a", "b"]) is None, "moves that even nothing"
    assert ds._argus_spread_source({"a": 4}, ["a"]) is None, "no other node has room (a GPU each)"
    assert ds._argus_spread_source({}, ["a"]) is None
    assert [ds._argus_spread_backoff(f) for f in range(7)] == [15, 30, 60, 120, 240, 300, 300]
    assert ds._argus_spread_backoff(10**6) == 300
    assert sc._argus_fewest({"a": 3, "b": 1}, ["a", "b"]) == "b"
    assert sc._argus_fewest({"a": 3}, ["a", "c"]) == "c", "an empty node with room first"
    assert sc._argus_fewest({"a": 1}, []) is None
    assert sc._argus_fewest({}, ["a", "b"], {"a": 2}) == "b", (
        "a new deployment's first replica goes where fewest replicas of any deployment run")
    for replicas, nodes in ((2, 2), (4, 2), (5, 3), (7, 2), (10, 4)):
        counts = {"n0": replicas}
        fits = [f"n{i}" for i in range(nodes)]
        for _ in range(replicas):
            src = ds._argus_spread_source(counts, fits)
            if src is None:
                break
            dst = sc._argus_fewest(counts, fits)
            assert dst != src, f"{replicas} over {nodes}: a move from {src} to itself"
            counts[dst] = counts.get(dst, 0) + 1
            counts[src] -= 1
        got = [counts.get(n, 0) for n in fits]
        assert max(got) - min(got) <= 1, f"{replicas} replicas over {nodes} nodes ended {got}"
    print("patch_serve: replicas moved together spread again, start-first, one at a time, "
          "to even over the nodes with room")


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
