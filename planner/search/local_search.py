"""Local search on the best candidate, under its setting, by the surrogate step time.

Moves (each keeps every device in at most one stage):

* ``move``   one stage unit from pipeline A to pipeline B;
* ``swap``   two units of different kinds between two pipelines;
* ``merge``  two pipelines into one;  ``split``  one pipeline into two (alternate units);
* ``tp-split`` a TP-``t`` stage into two TP-``t/2`` stages;  ``tp-merge`` two stages of one node
  in one pipeline into one TP group;  ``tp-grow`` a stage to a larger TP degree with GPUs of its
  node taken from other stages of any pipeline (only TP degrees the model allows).

Changed pipelines are put back in the phase-2 stage order (:func:`.stages.order_units`), so
the local search stays inside the space the enumerator (:mod:`.enumerate`) covers.

Layers are not moved one by one here: the refinement already places them optimally for the
surrogate (:func:`planner.search.layer_split.split_layers` is exact), so every move is scored with
its best layer and batch split. A deterministic pass (:func:`_grow_pass`) first, and again
whenever the random moves stall, grows each used stage's TP group with idle GPUs of its node.
:func:`polish_layers` then moves single layers of the chosen
plan while the full estimate (which simulates the schedule) improves. Each round draws ``MOVES_PER_ROUND`` moves with a
``random.Random(seed)`` generator, takes the best improving one, and stops after ``PATIENCE``
rounds without improvement, after ``MAX_EVALUATIONS`` new evaluations (``LARGE_EVALUATIONS``
above ``SMALL_CLUSTER`` devices), or when the search's budget or time limit is spent. The local
search is skipped above ``MAX_PIPELINES`` pipelines (large clusters rely on the hierarchical
partition, whose identical pipelines these moves would only break up).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, replace

from planner.cluster import ClusterSpec
from planner.cost import Estimate, ProfileSet, estimate
from planner.interleave import interleaved
from planner.model import ModelSpec
from planner.plan import Pipeline, Plan, Stage
from planner.search.budget import BudgetSpent
from planner.search.candidate import Candidate
from planner.search.graph import Unit, merge_units, split_unit
from planner.search.oracle import Setting
from planner.search.stages import order_units, tp_choices
from planner.search.stats import SearchStats

MOVES_PER_ROUND = 24
PATIENCE = 3
MAX_PIPELINES = 64
MAX_ROUNDS = 60
MAX_EVALUATIONS = 120  # of the local search, on top of the search's own budget (<= SMALL_CLUSTER devices)
LARGE_EVALUATIONS = 24  # above that, where one evaluation costs more and the partitions are richer
SMALL_CLUSTER = 64

Pipes = list[list[Unit]]


@dataclass(frozen=True)
class Climb:
    """What the local search takes from the search: the cluster and model, the seed of its moves,
    how to score pipelines under a setting (raises :class:`BudgetSpent` when the search's budget is
    spent), how many evaluations the search has spent so far, and the log to write to."""

    cluster: ClusterSpec
    model: ModelSpec
    seed: int
    evaluate: Callable[[Pipes, Setting], Candidate]
    spent: Callable[[], int]
    log: list[str]


def improve(search: Climb, start: Candidate) -> Candidate:
    """Hill-climb from ``start`` (module docstring); returns the best candidate seen."""
    if len(start.pipelines) > MAX_PIPELINES:
        search.log.append(f"local search skipped: {len(start.pipelines)} pipelines > {MAX_PIPELINES}")
        return start
    rng = random.Random(search.seed)
    moves = _Moves(search.cluster, search.model)
    kinds: list[Callable[[Pipes, random.Random], Pipes | None]] = [
        moves.move, moves.swap, moves.merge, moves.split, moves.tp_split, moves.tp_merge, moves.tp_grow]
    best = start
    stale = rounds = 0
    budget = MAX_EVALUATIONS if search.cluster.num_devices <= SMALL_CLUSTER else LARGE_EVALUATIONS
    stop_at = search.spent() + budget
    try:
        best = _grow_pass(search, best, moves, stop_at)
        while rounds < MAX_ROUNDS and search.spent() < stop_at:
            if stale >= PATIENCE:  # stuck: one deterministic grow pass, then stop if it finds nothing
                grown = _grow_pass(search, best, moves, stop_at)
                if grown is best:
                    break
                best, stale = grown, 0
            rounds += 1
            round_best = best
            for _ in range(MOVES_PER_ROUND):
                move = kinds[rng.randrange(len(kinds))]
                pipes = move(_copy(best.pipelines), rng)
                if pipes is None or not _valid(search, pipes):
                    continue
                pipes = [order_units(search.cluster, p) for p in pipes]
                cand = search.evaluate(pipes, best.setting)
                if cand.feasible and cand.step_s < round_best.step_s * (1 - 1e-9):
                    round_best = cand
            if round_best is not best:
                search.log.append(f"local search: {best.step_s:.4f} -> {round_best.step_s:.4f} s")
                best = round_best
                stale = 0
            else:
                stale += 1
    except BudgetSpent:
        search.log.append("local search stopped by the budget")
    return best


def _copy(pipes: Pipes) -> Pipes:
    return [list(p) for p in pipes]


def _valid(search: Climb, pipes: Pipes) -> bool:
    """No empty pipeline, no more stages than layers, only TP degrees the model allows."""
    L = search.model.num_layers
    return all(p and len(p) <= L and all(u.tp in tp_choices(search.model, u.tp) for u in p) for p in pipes)


def _place(p: list[Unit], u: Unit) -> None:
    p.append(u)  # the caller restores the phase-2 order


class _Moves:
    """The moves of the module docstring; each edits a copy of the pipelines or returns None."""

    def __init__(self, cluster: ClusterSpec, model: ModelSpec):
        self.cluster = cluster
        self.model = model
        self.next_index = 1 << 30  # indices of units made by TP moves (never clash with make_units)

    def move(self, pipes: Pipes, rng: random.Random) -> Pipes | None:
        if len(pipes) < 2:
            return None
        a, b = rng.sample(range(len(pipes)), 2)
        if len(pipes[a]) < 2:
            return None
        _place(pipes[b], pipes[a].pop(rng.randrange(len(pipes[a]))))
        return pipes

    def swap(self, pipes: Pipes, rng: random.Random) -> Pipes | None:
        if len(pipes) < 2:
            return None
        a, b = rng.sample(range(len(pipes)), 2)
        i, j = rng.randrange(len(pipes[a])), rng.randrange(len(pipes[b]))
        if pipes[a][i].signature == pipes[b][j].signature:
            return None
        u, v = pipes[a].pop(i), pipes[b].pop(j)
        _place(pipes[a], v)
        _place(pipes[b], u)
        return pipes

    def merge(self, pipes: Pipes, rng: random.Random) -> Pipes | None:
        if len(pipes) < 2:
            return None
        a, b = sorted(rng.sample(range(len(pipes)), 2))
        for u in pipes.pop(b):
            _place(pipes[a], u)
        return pipes

    def split(self, pipes: Pipes, rng: random.Random) -> Pipes | None:
        a = rng.randrange(len(pipes))
        if len(pipes[a]) < 2:
            return None
        p = pipes[a]
        pipes[a] = p[0::2]
        pipes.insert(a + 1, p[1::2])
        return pipes

    def tp_split(self, pipes: Pipes, rng: random.Random) -> Pipes | None:
        a = rng.randrange(len(pipes))
        i = rng.randrange(len(pipes[a]))
        if pipes[a][i].tp < 2 or pipes[a][i].cp > 1:  # TP moves leave CP meshes whole
            return None
        x, y = split_unit(self.cluster, pipes[a][i], self.next_index)
        self.next_index += 2
        pipes[a][i:i + 1] = [x, y]
        return pipes

    def tp_merge(self, pipes: Pipes, rng: random.Random) -> Pipes | None:
        a = rng.randrange(len(pipes))
        p = pipes[a]
        pairs = [(i, j) for i in range(len(p)) for j in range(i + 1, len(p))
                 if p[i].node == p[j].node and p[i].tp == p[j].tp and p[i].cp == p[j].cp == 1]
        if not pairs:
            return None
        i, j = pairs[rng.randrange(len(pairs))]
        p[i] = merge_units(self.cluster, p[i], p[j], self.next_index)
        self.next_index += 1
        del p[j]
        return pipes

    def grow_to(self, pipes: Pipes, a: int, i: int, target: int, idle: set[int]) -> Pipes | None:
        """Stage ``i`` of pipeline ``a`` grown to TP ``target`` with GPUs of its node from other
        stages: whole groups, from idle pipelines (``idle``) first, then largest first."""
        u = pipes[a][i]
        if u.cp > 1:
            return None
        donors = sorted(((b, j, v) for b, p in enumerate(pipes) for j, v in enumerate(p)
                         if v.node == u.node and v is not u and v.cp == 1),
                        key=lambda x: (x[0] not in idle, -x[2].tp, x[0], x[1]))
        need, taken = target - u.tp, []
        for b, j, v in donors:
            if v.tp <= need:
                taken.append((b, j, v))
                need -= v.tp
            if need == 0:
                break
        if need:
            return None
        grown = u
        for _, _, v in taken:
            grown = merge_units(self.cluster, grown, v, self.next_index)
            self.next_index += 1
        pipes[a][i] = grown
        for b, j, _ in sorted(taken, key=lambda x: (x[0], -x[1])):
            del pipes[b][j]
        return pipes

    def tp_grow(self, pipes: Pipes, rng: random.Random) -> Pipes | None:
        """Raise a stage's TP degree (to any larger allowed one) with GPUs of its node taken from
        other stages of any pipeline: whole groups, largest first, adding up to exactly the gap."""
        a = rng.randrange(len(pipes))
        i = rng.randrange(len(pipes[a]))
        u = pipes[a][i]
        larger = [t for t in tp_choices(self.model, self.cluster.node(u.node).gpus) if t > u.tp]
        if not larger:
            return None
        target = larger[rng.randrange(len(larger))]
        return self.grow_to(pipes, a, i, target, set())


def _grow_pass(search: Climb, start: Candidate, moves: _Moves, stop_at: int) -> Candidate:
    """Deterministic first step: grow each used stage's TP degree with GPUs its node has idle in
    dropped pipelines (or in other stages), keeping the best improvement, until none improves. It
    reaches what single random moves cannot when the intermediate degree is worse (TP 1 -> 4).
    Counts against the local search's evaluation budget (``stop_at``)."""
    best = start
    improved = True
    while improved and search.spent() < stop_at:
        improved = False
        used = {id(lay.units[0]) for lay in best.layouts}
        idle = {b for b, p in enumerate(best.pipelines) if id(p[0]) not in used}
        round_best = best
        for a, p in enumerate(best.pipelines):
            if a in idle:
                continue
            for i, u in enumerate(p):
                for target in tp_choices(search.model, search.cluster.node(u.node).gpus):
                    if target <= u.tp:
                        continue
                    if search.spent() >= stop_at:
                        break
                    pipes = moves.grow_to(_copy(best.pipelines), a, i, target, idle)
                    if pipes is None:
                        continue
                    pipes = [order_units(search.cluster, q) for q in pipes if q]
                    if not _valid(search, pipes):
                        continue
                    cand = search.evaluate(pipes, best.setting)
                    if cand.feasible and cand.step_s < round_best.step_s * (1 - 1e-9):
                        round_best = cand
        if round_best is not best:
            search.log.append(f"local search (grow): {best.step_s:.4f} -> {round_best.step_s:.4f} s")
            best, improved = round_best, True
    return best


POLISH_DEVICES = 64  # clusters up to this size get the layer polish under the full estimate
POLISH_ESTIMATES = 12


def polish_layers(plan: Plan, est: Estimate, *, cluster: ClusterSpec, profiles: ProfileSet,
                  log: list[str], stats: SearchStats | None = None,
                  stop: Callable[[], bool] = lambda: False) -> tuple[Plan, Estimate]:
    """Move single layers between stages while the full cost-model estimate improves.

    The refinement's layer split is exact for the closed-form schedule; the estimate simulates
    the schedule, which can differ by a few percent when the slowest stage sits mid-pipeline.
    Pipelines with the same devices kinds and split move together (so identical pipelines stay
    identical and their gradient-sync groups stay aligned); a layer moves from one of the two
    busiest stages to one of the two least busy, or to a neighbour. At most ``POLISH_ESTIMATES`` estimates,
    clusters of at most ``POLISH_DEVICES`` devices; moves that run out of memory are rejected; ``stop()``
    true (the search's time limit) ends it before the next estimate."""
    if cluster.num_devices > POLISH_DEVICES:
        return plan, est
    calls = 0
    improved = True
    while improved and calls < POLISH_ESTIMATES:
        improved = False
        groups: dict[tuple[object, ...], list[int]] = {}
        for pi, p in enumerate(plan.pipelines):
            key = (tuple((cluster.device(s.devices[0]).gpu, s.tp) for s in p.stages),
                   tuple(s.num_layers for s in p.stages), p.schedule)
            groups.setdefault(key, []).append(pi)
        for members in groups.values():
            stages = plan.pipelines[members[0]].stages
            per_stage = est.pipelines[members[0]].stages
            busy = [x.forward_s + x.backward_s for x in per_stage]
            order = sorted(range(len(stages)), key=lambda i: -busy[i])
            moves = [(a, b) for a in order[:2] for b in reversed(order[-2:]) if a != b]
            moves += [(a, a + d) for a in order[:1] for d in (1, -1) if 0 <= a + d < len(stages)]
            for src, dst in dict.fromkeys(moves):
                counts = [x.num_layers for x in stages]
                counts[src] -= 1
                counts[dst] += 1
                if min(counts) < plan.pipelines[members[0]].chunks or calls >= POLISH_ESTIMATES:
                    continue
                if stop():
                    return plan, est
                trial = _with_counts(plan, members, counts)
                calls += 1
                trial_est = estimate(trial, cluster, profiles)
                if stats is not None:
                    stats.estimates += 1
                if trial_est.fits and trial_est.step_time_s < est.step_time_s * (1 - 1e-6):
                    log.append(f"layer polish: {est.step_time_s:.4f} -> {trial_est.step_time_s:.4f} s")
                    plan, est, improved = trial, trial_est, True
                    break
            if improved:
                break
    return plan, est


def _with_counts(plan: Plan, members: list[int], counts: list[int]) -> Plan:
    pipes = list(plan.pipelines)
    for pi in members:
        p = pipes[pi]
        stages, start = [], 0
        for s, n in zip(p.stages, counts):
            stages.append(Stage(s.devices, s.tp, (start, start + n), s.cp))
            start += n
        plain = Pipeline(p.batch_size, p.micro_batches, tuple(stages))
        # an interleaved pipeline's stages are cut into their chunks again (planner.interleave)
        pipes[pi] = replace(plain, schedule=p.schedule) if p.chunks == 1 else interleaved(plain, p.chunks, p.schedule)
    return Plan(plan.model, plan.global_batch_size, tuple(pipes), plan.options, plan.cluster, plan.estimate)
