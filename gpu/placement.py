"""Where the engines go: one placement group spreading them over ``nodes`` distinct nodes (``STRICT_SPREAD``).

With as many engines as nodes each bundle holds one engine; with more engines than nodes, engine ``i`` goes to bundle
``i % nodes`` and each bundle is sized for the engines it holds (so the nodes stay distinct and balanced). A cluster
with fewer nodes able to hold an engine than asked for is a clear error before anything is reserved.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping


class PlacementError(RuntimeError):
    """The engines cannot be placed as asked (the message lists the cluster's nodes)."""


@dataclass
class Placement:
    """A reserved placement group and, per engine, the bundle (hence the node) it runs in."""

    group: Any
    bundle_of_engine: list[int]

    def strategy(self, engine: int) -> Any:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return PlacementGroupSchedulingStrategy(self.group, placement_group_bundle_index=self.bundle_of_engine[engine])

    def remove(self) -> None:
        from ray.util.placement_group import remove_placement_group

        remove_placement_group(self.group)


def bundles_for(engines: int, nodes: int, per_engine: Mapping[str, float]) -> tuple[list[dict[str, float]], list[int]]:
    """The bundles (one per node) and each engine's bundle index."""
    if nodes < 1:
        raise PlacementError(f"--conformance-nodes must be >= 1 (got {nodes})")
    if engines < nodes:
        raise PlacementError(f"{engines} engine(s) cannot cover {nodes} distinct nodes: use at least as many "
                             f"engines as nodes")
    bundle_of_engine = [i % nodes for i in range(engines)]
    bundles = [{k: v * bundle_of_engine.count(b) for k, v in per_engine.items() if v} for b in range(nodes)]
    return bundles, bundle_of_engine


def nodes_that_fit(per_engine: Mapping[str, float]) -> list[dict[str, Any]]:
    """The live nodes whose total resources hold one engine."""
    import ray

    return [n for n in ray.nodes() if n.get("Alive")
            and all(n.get("Resources", {}).get(k, 0) >= v for k, v in per_engine.items() if v)]


def describe_nodes() -> str:
    import ray

    return "; ".join(f"{n['NodeID'][:12]} {n.get('NodeManagerAddress')} alive={n.get('Alive')} "
                     f"{ {k: v for k, v in n.get('Resources', {}).items() if k in ('CPU', 'GPU')} }"
                     for n in ray.nodes())


def place_engines(engines: int, nodes: int, per_engine: Mapping[str, float], timeout_s: float = 60.0) -> Placement:
    """Reserve a ``STRICT_SPREAD`` placement group for ``engines`` engines over ``nodes`` nodes."""
    from ray.util.placement_group import placement_group, remove_placement_group

    bundles, bundle_of_engine = bundles_for(engines, nodes, per_engine)
    fit = nodes_that_fit(per_engine)
    if len(fit) < nodes:
        raise PlacementError(f"--conformance-nodes {nodes}: the cluster has {len(fit)} live node(s) with room for an engine "
                             f"({dict(per_engine)}); nodes: {describe_nodes()}")
    group = placement_group(bundles, strategy="STRICT_SPREAD")
    if not group.wait(timeout_s):
        remove_placement_group(group)
        raise PlacementError(f"could not reserve {bundles} on {nodes} distinct nodes within {timeout_s:.0f}s "
                             f"(resources held by other work?); nodes: {describe_nodes()}")
    return Placement(group, bundle_of_engine)
