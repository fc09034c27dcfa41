"""What CPStageComm.exchange posts in an interleaved pipeline's rounds (no processes: torch.distributed's
p2p calls are recorded): every slot leader posts, per exchange, one batch per peer slot leader on
that pair's boundary group, sends before receives, each in op order — exactly the slot-level messages
of planner.schedules.slot_comm, which check_pairing plays without a wait cycle — and each send
carries the very tensor its op produced."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from exec_jobs import TINY8, make_plan

import executor.parallel.cp_p2p as cp_p2p
from executor.parallel.cp_p2p import CPStageComm
from executor.parallel.schedules import run_rounds
from planner.layout import build_topology
from planner.schedules import schedule_named
from planner.schedules.comm import check_pairing, steps
from planner.schedules.slot_comm import slot_exchanges

H = 1  # hidden size of the stand-in activations


def _code(kind: str, j: int, k: int) -> float:
    """A tensor's label as one number: F/B, micro-batch ``j``, the virtual stage that takes it."""
    return (1000.0 if kind == "F" else 2000.0) + 10 * j + k


class Runner:
    """Stands in for ``_Runner``: each op's output is filled with the label of the message it becomes."""

    def __init__(self, stages: int, index: int, chunks: int, m: int, local: int):
        self.n, self.index, self.chunks = stages, index, chunks
        self.shapes = [(1, local, H)] * m

    def forward(self, j: int, x: Any, chunk: int) -> torch.Tensor | None:
        k = chunk * self.n + self.index
        return None if k == self.n * self.chunks - 1 else torch.full(self.shapes[j], _code("F", j, k + 1))

    def backward(self, j: int, dy: Any, chunk: int) -> torch.Tensor | None:
        k = chunk * self.n + self.index
        return None if k == 0 else torch.full(self.shapes[j], _code("B", j, k - 1))


class FakeDist:
    """The p2p part of torch.distributed, recording each batch as ``(group, [(send, peer, label)])``."""

    isend, irecv = "isend", "irecv"

    def __init__(self) -> None:
        self.batches: list[tuple[Any, list[tuple[bool, int, float | None]]]] = []

    def P2POp(self, op: str, t: torch.Tensor, peer: int, group: Any = None) -> Any:  # noqa: N802
        return SimpleNamespace(op=op, t=t, peer=peer, group=group)

    def batch_isend_irecv(self, ops: list[Any]) -> list[Any]:
        assert len({o.group for o in ops}) == 1 and len({o.peer for o in ops}) == 1
        rows = []
        for o in ops:
            send = o.op == "isend"
            if send:
                assert (o.t == o.t.flatten()[0]).all()  # one op's tensor, never two mixed
            rows.append((send, o.peer, float(o.t.flatten()[0]) if send else None))
        self.batches.append((ops[0].group, rows))
        return []


@pytest.mark.parametrize(("stages", "m"), [([(1, 3, 2), (1, 3, 1), (1, 2, 1)], 3), ([(1, 4, 2), (1, 4, 2)], 4),
                                           ([(2, 4, 1), (1, 4, 2)], 2)])
def test_cp_rounds_post_the_slot_messages(monkeypatch: pytest.MonkeyPatch, stages: list[tuple[int, ...]],
                                          m: int) -> None:
    plan = make_plan(TINY8, [(m, m, "interleaved-1f1b", stages)])
    topo = build_topology(plan)
    sched, n = schedule_named("interleaved-1f1b"), len(stages)
    cps = tuple(st.cp for st in plan.pipelines[0].stages)
    want = slot_exchanges([steps(sched.ops(n, i, m), n, i, sched.chunks) for i in range(n)], cps)
    assert check_pairing(want) is None
    ring = topo.pipelines[0][0].stage_leaders
    parties = [r for g in ring for r in g]
    pairs = {frozenset(p) for p in topo.p2p_pairs()}
    for party, rank in enumerate(parties):
        st = topo.stage_of(rank)
        fake = FakeDist()
        monkeypatch.setattr(cp_p2p, "dist", fake)
        comm = CPStageComm(st, rank, None, device=torch.device("cpu"),
                           boundary=lambda a, b: frozenset((a, b)) if frozenset((a, b)) in pairs else None)
        posted: list[list[tuple[Any, list[tuple[bool, int, float | None]]]]] = []
        transfer = comm._transfer

        def recording(sends: Any, recvs: Any, transfer: Any = transfer, fake: FakeDist = fake,
                      posted: list[Any] = posted) -> None:
            fake.batches = []
            transfer(sends, recvs)
            posted.append(fake.batches)

        monkeypatch.setattr(comm, "_transfer", recording)
        run_rounds(Runner(n, st.index, sched.chunks, m, plan.model.seq_len // st.cp), comm,  # type: ignore[arg-type]
                   sched.ops(n, st.index, m), n)
        mine = [ex for ex in want[party] if ex[0].what[0] != "C"]  # the barriers are attention's, not p2p
        assert len(posted) == len(mine)
        for batches, ex in zip(posted, mine):
            assert all(group == frozenset((rank, peer)) for group, rows in batches for _, peer, _ in rows)
            got = {rows[0][1]: [(s, label) for s, _, label in rows] for _, rows in batches}
            expect: dict[int, list[tuple[bool, float | None]]] = {}
            for x in ex:
                expect.setdefault(parties[x.peer], []).append((x.send, _code(*x.what) if x.send else None))
            assert got == expect and [p for p in got] == sorted(got)
