"""Re-planning a strategy pool for a changed device set (pure, no torch): what an elastic job on a
pool does when devices leave or join (:mod:`hexiscale.launch.elastic`).

Each strategy's plan is re-planned onto the new devices with :func:`planner.replan.replan`
(warm-started from that strategy's running plan, so the new pool is never worse under the
search's surrogate than the old structure on the new devices). The home strategy goes first on
``devices``; every other strategy is re-planned onto exactly the devices the home's new plan uses
(the planner may leave a device of a small model idle, and a pool's strategies share one device
set). Names, order and the home index are kept, and the result is checked as any pool is
(:class:`~planner.varlen.pool.StrategyPool`); the pool's ``estimate`` (what proposed it) is dropped.
No strategy gets context parallelism (``replan(..., context_parallel=False)``): hot switching has no
CP layouts, which a pool refuses.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from planner.cluster import ClusterSpec
from planner.errors import SpecError
from planner.replan import replan
from planner.search.config import PlannerConfig
from planner.varlen.pool import Strategy, StrategyPool


def replan_pool(cluster: ClusterSpec, devices: Sequence[str], pool: StrategyPool, *,
                config: PlannerConfig | None = None) -> StrategyPool:
    """``pool`` re-planned for ``devices`` (module docstring); a ``SpecError`` names a strategy the
    planner could not place on the home strategy's devices."""
    home = replan(cluster, devices, pool.home_plan, config=config, context_parallel=False).plan
    on = list(home.devices)
    plans = {pool.home: home}
    for i, st in enumerate(pool.strategies):
        if i == pool.home:
            continue
        plan = replan(cluster, on, st.plan, config=config, context_parallel=False).plan
        if sorted(plan.devices) != sorted(on):
            raise SpecError(f"strategies[{i}]", f"{st.name!r} re-planned onto {sorted(plan.devices)}, the home "
                            f"strategy onto {sorted(on)}", "a pool's strategies share one device set: re-plan "
                            "the pool for these devices with 'hexiscale plan --lengths'")
        plans[i] = plan
    strategies = tuple(Strategy(st.name, plans[i]) for i, st in enumerate(pool.strategies))
    return replace(pool, strategies=strategies, estimate=None)
