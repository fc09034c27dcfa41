"""The executor's schedule interpreter (executor.parallel.schedules.run_ops) runs the registry's ops, with a
communication order that no two stages can deadlock on, without processes: a recording runner and
p2p stand in for the stage module and StageComm."""

from __future__ import annotations

from typing import Any

import pytest
from exec_jobs import TINY, make_plan

from executor.parallel.schedules import check_plan_schedules, check_trainable, run_ops
from planner.errors import SpecError
from planner.schedules import REGISTRY, TRAINED_SCHEDULES, Schedule, StageOp, schedule_named
from planner.schedules.one_f_one_b import one_f_one_b_ops

ONE_CHUNK = [n for n in TRAINED_SCHEDULES if schedule_named(n).chunks == 1]  # run_ops; interleaved: run_rounds

# p2p call -> (sends to, receives from): "next" / "prev" stage
CHANNELS = {"recv_forward": ((), ("prev",)), "send_forward": (("next",), ()), "recv_backward": ((), ("next",)),
            "send_backward": (("prev",), ()), "send_forward_recv_backward": (("next",), ("next",)),
            "send_backward_recv_forward": (("prev",), ("prev",))}


class Recorder:
    """Stands in for ``_Runner`` and ``StageComm`` of stage ``index`` of ``stages``."""

    def __init__(self, stages: int, index: int, m: int):
        self.first, self.last = index == 0, index == stages - 1
        self.shapes = [(1, 4, 8)] * m
        self.compute: list[StageOp] = []
        self.calls: list[str] = []

    def forward(self, j: int, x: Any) -> Any:
        assert (x is None) == self.first, "a forward gets its input from the previous stage"
        self.compute.append(StageOp("F", j))
        return None if self.last else f"y{j}"

    def backward(self, j: int, dy: Any) -> Any:
        assert (dy is None) == self.last, "a backward gets its output gradient from the next stage"
        self.compute.append(StageOp("B", j))
        return None if self.first else f"dx{j}"

    def weight_grads(self, j: int, chunk: int = 0) -> None:
        self.compute.append(StageOp("W", j, chunk))

    def __getattr__(self, name: str) -> Any:
        if name not in CHANNELS:
            raise AttributeError(name)
        sends, recvs = CHANNELS[name]
        edge = (self.first and "prev" in sends + recvs) or (self.last and "next" in sends + recvs)

        def call(*args: Any) -> Any:
            if not edge:  # StageComm does nothing towards a missing neighbour
                self.calls.append(name)
            return None if (not recvs or edge) else "t"
        return call


def _run(name: str, stages: int, m: int) -> list[Recorder]:
    recs = [Recorder(stages, i, m) for i in range(stages)]
    for i, r in enumerate(recs):
        run_ops(r, r, schedule_named(name).ops(stages, i, m))  # type: ignore[arg-type]
    return recs


def test_1f1b_communication_by_hand() -> None:
    """Stage 1 of 3, m=4: Megatron's order (one warm-up forward, three steady rounds, one cool-down)."""
    mid = _run("1f1b", 3, 4)[1]
    assert mid.calls == ["recv_forward", "send_forward", "recv_forward",
                         "send_forward_recv_backward", "send_backward_recv_forward",
                         "send_forward_recv_backward", "send_backward_recv_forward",
                         "send_forward_recv_backward", "send_backward", "recv_backward", "send_backward"]


def _deadlock_free(recs: list[Recorder]) -> bool:
    """Rendezvous model (a send completes only when received): each call posts its sends and
    receives together and returns when all are matched; per direction, messages match in order."""
    posted = [0] * len(recs)  # index of each stage's current call
    done: list[set[tuple[str, str]]] = [set() for _ in recs]  # matched parts of the current call

    def parts(i: int) -> set[tuple[str, str]]:
        if posted[i] >= len(recs[i].calls):
            return set()
        sends, recvs = CHANNELS[recs[i].calls[posted[i]]]
        return {("send", p) for p in sends} | {("recv", p) for p in recvs}

    while any(posted[i] < len(r.calls) for i, r in enumerate(recs)):
        progressed = False
        for i in range(len(recs)):
            for act, peer in parts(i) - done[i]:
                j = i + 1 if peer == "next" else i - 1
                other = ("recv" if act == "send" else "send", "prev" if peer == "next" else "next")
                if other in parts(j) - done[j]:
                    done[i].add((act, peer))
                    done[j].add(other)
                    progressed = True
        for i in range(len(recs)):
            if parts(i) and parts(i) == done[i]:
                posted[i] += 1
                done[i] = set()
                progressed = True
        if not progressed:
            return False
    return True


@pytest.mark.parametrize("name", ONE_CHUNK)
def test_interpreter_runs_the_registry_ops_without_deadlock(name: str) -> None:
    for stages in range(1, 6):
        for m in range(1, 8):
            recs = _run(name, stages, m)
            for i, r in enumerate(recs):
                assert r.compute == schedule_named(name).ops(stages, i, m)
            assert _deadlock_free(recs), (name, stages, m)


def test_rendezvous_model_sees_unfused_1f1b_deadlock() -> None:
    """The checker is not vacuous: 1F1B with every send posted alone deadlocks two stages."""
    recs = _run("1f1b", 2, 3)
    for r in recs:
        r.calls = [c for call in r.calls for c in
                   {"send_forward_recv_backward": ["send_forward", "recv_backward"],
                    "send_backward_recv_forward": ["send_backward", "recv_forward"]}.get(call, [call])]
    assert not _deadlock_free(recs)


def test_unknown_schedule_is_refused_by_the_executor() -> None:
    with pytest.raises(SpecError, match=r"^pipelines\[0\]\.schedule: unknown schedule 'zb'"):
        check_trainable("zb", 2, 4, "pipelines[0].schedule")


def test_priced_schedules_are_refused_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """A schedule the registry marks priced only (none is, today: a stand-in) is refused in one line."""
    monkeypatch.setitem(REGISTRY, "x-priced", Schedule("x-priced", one_f_one_b_ops, trained=False))
    with pytest.raises(SpecError) as e:
        check_trainable("x-priced", 2, 4, "pipelines[0].schedule")
    assert str(e.value) == ("pipelines[0].schedule: schedule 'x-priced' is priced but not trained yet "
                            f"(hint: train with {', '.join(TRAINED_SCHEDULES)}; 'hexiscale estimate' prices x-priced)")
    plan = make_plan(TINY, [(2, 2, "1f1b", [(1, 2), (1, 2)]), (2, 2, "x-priced", [(1, 4)])])
    with pytest.raises(SpecError, match=r"^pipelines\[1\]\.schedule: schedule 'x-priced' is priced"):
        check_plan_schedules(plan)
    check_plan_schedules(make_plan(TINY, [(4, 2, "gpipe", [(1, 2), (1, 2)]), (4, 4, "zb-h1", [(1, 2), (1, 2)])]))


def test_zb_h1_communication_by_hand() -> None:
    """Stage 0 of 2, m=3 (F0 F1 B0 W0 F2 B1 W1 B2 W2): a W sits between a B's send and the next
    receive, so no send is fused across it."""
    first, last = _run("zb-h1", 2, 3)
    assert first.calls == ["send_forward", "send_forward_recv_backward", "send_forward_recv_backward",
                           "recv_backward"]
    assert last.calls == ["recv_forward", "send_backward_recv_forward", "send_backward", "recv_forward",
                          "send_backward"]


@pytest.mark.parametrize("name", TRAINED_SCHEDULES)
def test_a_pipeline_without_micro_batches_runs_no_op(name: str) -> None:
    """A hot-switching phase may give a pipeline no sequences: its ranks run nothing and send nothing
    (the registry's op lists start at one micro-batch)."""
    from types import SimpleNamespace

    import torch

    from executor.parallel.schedules import run_schedule

    comm = Recorder(3, 1, 0)
    comm.stage = SimpleNamespace(index=1)  # type: ignore[attr-defined]
    module = SimpleNamespace(spec=SimpleNamespace(hidden_size=8), modules=lambda: iter([torch.nn.Linear(2, 2)]))
    assert run_schedule(name, module=module, comm=comm, micro=[], loss_scale=1.0, n_stages=3) is None  # type: ignore[arg-type]
    assert comm.calls == [] and comm.compute == []


class RoundsRecorder:
    """Stands in for ``_Runner`` and ``StageComm`` of an interleaved stage: records the exchanges
    :func:`executor.parallel.schedules.run_rounds` posts, as :class:`planner.schedules.comm.Message`\\ s."""

    def __init__(self, stages: int, index: int, m: int, chunks: int):
        from types import SimpleNamespace
        self.stage = SimpleNamespace(index=index)
        self.n, self.chunks, self.index = stages, chunks, index
        self.shapes = [(1, 4, 8)] * m
        self.compute: list[StageOp] = []
        self.posted: list[tuple[Any, ...]] = []

    def _label(self, j: int, chunk: int, kind: str) -> tuple[str, int, int]:
        return kind, j, chunk * self.n + self.index

    def forward(self, j: int, x: Any, chunk: int) -> Any:
        k = chunk * self.n + self.index
        assert x == (None if k == 0 else ("F", j, k)), (x, j, chunk)  # the input of this very op
        self.compute.append(StageOp("F", j, chunk))
        return None if k == self.n * self.chunks - 1 else ("F", j, k + 1)

    def backward(self, j: int, dy: Any, chunk: int) -> Any:
        k = chunk * self.n + self.index
        assert dy == (None if k == self.n * self.chunks - 1 else ("B", j, k)), (dy, j, chunk)
        self.compute.append(StageOp("B", j, chunk))
        return None if k == 0 else ("B", j, k - 1)

    def exchange(self, sends: list[tuple[Any, int]], recvs: list[tuple[Any, int]]) -> list[Any]:
        from planner.schedules.comm import Message
        self.posted.append(tuple([Message(p, True, t) for t, p in sends] + [Message(p, False, ("?", 0, 0))
                                                                           for _, p in recvs]))
        return [self.pending.pop(0) for _ in recvs]


@pytest.mark.parametrize(("stages", "m"), [(2, 2), (2, 6), (3, 3), (4, 8), (4, 4)])
def test_interleaved_rounds_post_what_the_pairing_check_proves(stages: int, m: int) -> None:
    """run_rounds computes the registry's ops in order, each on its own input, and posts exactly the
    exchanges of planner.schedules.comm.exchanges (sends with their tensors; receives by peer),
    which check_pairing plays without a wait cycle."""
    from executor.parallel.schedules import run_rounds
    from planner.schedules.comm import check_pairing, exchanges

    sched = schedule_named("interleaved-1f1b")
    want = [exchanges(sched.ops(stages, i, m), stages, i, sched.chunks) for i in range(stages)]
    assert check_pairing(want) is None
    for i in range(stages):
        rec = RoundsRecorder(stages, i, m, sched.chunks)
        rec.pending = [msg.what for ex in want[i] for msg in ex if not msg.send]  # type: ignore[attr-defined]
        run_rounds(rec, rec, sched.ops(stages, i, m), stages)  # type: ignore[arg-type]
        assert rec.compute == sched.ops(stages, i, m)
        assert [[(x.peer, x.send) + ((x.what,) if x.send else ()) for x in ex] for ex in rec.posted] == \
            [[(x.peer, x.send) + ((x.what,) if x.send else ()) for x in ex] for ex in want[i]]
