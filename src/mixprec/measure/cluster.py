"""Connecting to a Ray cluster and finding its hardware types.

A node says what hardware it is with a custom resource ``mixprec-hw:LABEL``
(``ray start --resources '{"mixprec-hw:a100": 1}'``). :func:`node_groups` lists the
labels of the alive nodes; when no node has one, each node is its own group, named
``node-<id>``. :func:`select_groups` turns ``--hardware all`` or ``--hardware a,b``
into groups, and refuses a label no node has, naming what the cluster has.
:func:`probe_group` probes the hardware and reads the software versions *on* a node
of the group, so a run stores where it was measured, not where it was started.
"""

from __future__ import annotations

import os
import socket
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

from mixprec._quote import quote
from mixprec.measure.ray_executor import HARDWARE_PREFIX, LABEL_SHARE, RayExecutor, hardware_resource, require_ray

__all__ = ["ClusterError", "NodeGroup", "connect", "node_groups", "select_groups", "probe_group", "describe_groups"]

PROBE_TIMEOUT_S = 600.0


class ClusterError(ValueError):
    """The cluster cannot be used as asked; nothing was started on it."""


@dataclass(frozen=True)
class NodeGroup:
    """Nodes of one hardware type.

    Attributes:
        label: the hardware label (``mixprec-hw:LABEL``), or ``node-<id>`` for a node without one.
        node_ids: the alive nodes of this type.
        hosts: their addresses.
        cpus: CPUs over all of them.
        gpus: GPUs over all of them.
        labelled: whether the label is a custom resource (else the group is one node, pinned by id).
    """

    label: str
    node_ids: tuple[str, ...]
    hosts: tuple[str, ...]
    cpus: float
    gpus: float
    labelled: bool = True

    def executor(self, ray: Any, **options: Any) -> RayExecutor:
        """An executor whose workers run on this group's nodes."""
        if self.labelled:
            return RayExecutor(ray, label=self.label, **options)
        return RayExecutor(ray, node_id=self.node_ids[0], **options)

    def describe(self) -> str:
        nodes = f"{len(self.node_ids)} node{'s' if len(self.node_ids) != 1 else ''}"
        gpus = f", {self.gpus:g} GPUs" if self.gpus else ""
        return f"{self.label} ({nodes} at {', '.join(sorted(set(self.hosts)))}: {self.cpus:g} CPUs{gpus})"


def _check_reachable(address: str, flag: str) -> None:
    """Refuse an address nothing listens on, before Ray spends a minute retrying it."""
    target = address.split("://", 1)[-1]
    host, sep, port = target.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ClusterError(f"{flag} {quote(address)}: expected auto or HOST:PORT (e.g. 10.0.0.5:6379)")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=5):
            pass
    except OSError as exc:
        raise ClusterError(f"{flag} {quote(address)}: cannot reach a Ray cluster there ({exc}); start one with "
                           f"'ray start --head --port {port}' on that host, or check the address") from None


@contextmanager
def connect(address: str | None, *, flag: str = "--ray-address", num_cpus: int | None = None) -> Iterator[Any]:
    """Yield the ``ray`` module connected to ``address``; disconnect at the end.

    ``None`` starts a private single-node Ray on this machine; ``auto`` joins the
    cluster this machine belongs to; ``HOST:PORT`` joins that head node. A process that
    is already connected (``ray.init`` called before) is used as it is and stays connected.

    Raises:
        RayUnavailable: Ray is not installed.
        ClusterError: nothing to join at ``address``.
    """
    ray = require_ray()
    if ray.is_initialized():
        yield ray
        return
    if address is not None and address != "auto":
        _check_reachable(address, flag)
    try:
        if address is None:
            # "local": always a new private instance, never a cluster found on this machine
            ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
        else:
            ray.init(address=address, log_to_driver=False)
    except ConnectionError as exc:
        hint = "start one with 'ray start --head'"
        if address is not None and address != "auto" and not os.environ.get("RAY_AUTH_MODE"):
            # Ray does not send its token to a cluster named by address unless told to
            hint += ("; if the cluster uses token authentication (Ray's default where a token exists in "
                     "~/.ray/auth_token), set RAY_AUTH_MODE=token here, with the cluster's token in that file or in RAY_AUTH_TOKEN")
        raise ClusterError(f"{flag} {address}: no Ray cluster answered ({exc}); {hint}") from None
    try:
        yield ray
    finally:
        ray.shutdown()


def node_groups(ray: Any) -> list[NodeGroup]:
    """The hardware types of the alive nodes (labelled ones; every node apart when none is)."""
    alive = [n for n in ray.nodes() if n.get("Alive")]
    labelled: dict[str, list[dict[str, Any]]] = {}
    for node in alive:
        for key in node.get("Resources", {}):
            if key.startswith(HARDWARE_PREFIX):
                labelled.setdefault(key[len(HARDWARE_PREFIX):], []).append(node)

    def group(label: str, nodes: list[dict[str, Any]], is_label: bool) -> NodeGroup:
        return NodeGroup(label, tuple(n["NodeID"] for n in nodes), tuple(n.get("NodeManagerAddress", "?") for n in nodes),
                         sum(n.get("Resources", {}).get("CPU", 0) for n in nodes),
                         sum(n.get("Resources", {}).get("GPU", 0) for n in nodes), is_label)

    if labelled:
        return [group(label, nodes, True) for label, nodes in sorted(labelled.items())]
    return [group(f"node-{n['NodeID'][:8]}", [n], False) for n in alive]


def describe_groups(groups: list[NodeGroup]) -> str:
    return "; ".join(g.describe() for g in groups) or "no alive node"


def select_groups(groups: list[NodeGroup], spec: str | None, *, flag: str = "--hardware") -> list[NodeGroup]:
    """The groups ``--hardware`` names: ``all``, a comma-separated list of labels, or ``None``.

    ``None`` is allowed only when the cluster has one hardware type: the
    configurations of one run must all be timed on the same kind of machine.

    Raises:
        ClusterError: a label no alive node has, or ``None`` on a mixed cluster; the
            message lists what the cluster has.
    """
    have = describe_groups(groups)
    if not groups:
        raise ClusterError(f"the Ray cluster has no alive node to run on ({flag} {spec or '(not given)'})")
    if spec is None:
        if len(groups) > 1:
            raise ClusterError(f"the cluster has {len(groups)} hardware types: {have}; choose with {flag} LABEL[,LABEL] "
                               f"or {flag} all (one run per type)")
        return list(groups)
    if spec.strip() == "all":
        return list(groups)
    asked = [part.strip() for part in spec.split(",") if part.strip()]
    if not asked:
        raise ClusterError(f"{flag} {quote(spec)}: expected all or comma-separated labels; the cluster has: {have}")
    by_label = {g.label: g for g in groups}
    missing = [label for label in asked if label not in by_label]
    if missing:
        raise ClusterError(f"{flag} {spec!r}: no alive node has hardware {', '.join(map(repr, missing))} "
                           f"(resource {hardware_resource(missing[0])}); the cluster has: {have}")
    return [by_label[label] for label in dict.fromkeys(asked)]


def _probe_here(device: str) -> dict[str, Any]:  # pragma: no cover - runs on the cluster's node
    import os
    import socket as _socket

    import ray

    from mixprec.device.hardware import probe
    from mixprec.measure.machine import machine_fingerprint, versions

    hw = probe(device)
    return {"hardware": hw.to_dict(), "fingerprint": machine_fingerprint(hw), "versions": versions(),
            "node": {"node_id": ray.get_runtime_context().get_node_id(), "host": _socket.gethostname(),
                     "ip": ray.util.get_node_ip_address(), "cores": len(os.sched_getaffinity(0))}}


def probe_group(ray: Any, group: NodeGroup, device: str = "cpu", *, timeout: float = PROBE_TIMEOUT_S) -> dict[str, Any]:
    """Probe the hardware on a node of ``group``: ``hardware`` (a dict), ``fingerprint``,
    ``versions`` and ``node`` (id, host, address) as measured there.

    Raises:
        ClusterError: the probe failed or timed out on the node.
    """
    options: dict[str, Any] = {"num_cpus": 0, "max_retries": 0}
    if device.startswith("cuda"):
        options["num_gpus"] = LABEL_SHARE  # Ray hides the GPUs from a task that asks for none
    if group.labelled:
        options["resources"] = {hardware_resource(group.label): LABEL_SHARE}
    else:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(group.node_ids[0], soft=False)
    ref = ray.remote(_probe_here).options(**options).remote(device)
    try:
        info = ray.get(ref, timeout=timeout)
    except ray.exceptions.GetTimeoutError:
        ray.cancel(ref, force=True)
        raise ClusterError(f"probing hardware {group.describe()} took more than {timeout:.0f} s") from None
    except ray.exceptions.RayError as exc:
        raise ClusterError(f"probing hardware {group.describe()} failed: {str(exc).strip().splitlines()[0]}") from None
    info["node"]["label"] = group.label
    return info
