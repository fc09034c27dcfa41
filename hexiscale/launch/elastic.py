"""``hexiscale launch PLAN --local --elastic`` (or ``--trace TRACE``): an elastic job on this machine.

The supervisor does what :mod:`hexiscale.launch.local` does — host the TCPStore, start one
``hexiscale train`` per device (:mod:`hexiscale.launch.elastic_procs`), forward output, reap — and
drives the job's epochs through the store (:mod:`executor.switch.elastic_channel`):

* **Events.** A trace (:mod:`planner.elastic_trace`) schedules epoch ``e`` after its phase's first
  step up front (``at/<e>``); a ``hexiscale elastic leave|join`` request (``request/<n>``) is taken
  as soon as no other change is under way, and rank 0 switches after the next step.
* **One change at a time.** The new plan is the phase's, or re-planned for the new device set
  warm-started from the running plan (:func:`planner.replan.replan`, seconds, while the job trains).
  The layout may be a strategy pool (mixed-length data, hot switching): then each of its
  strategies is re-planned so (:func:`planner.varlen.replan_pool.replan_pool`), and the ranks
  follow its home plan.
  Its JSON is written (store and ``<run dir>/plan-<attempt>-<e>.json``), the joining devices are
  started and run their checks, and once all are ready the epoch is published; the ranks switch
  in process and the new rank 0 reports; the supervisor prints the report and, for a request,
  answers ``ok: ...``. Leaving processes exit 0 by themselves. Only then is the next change
  prepared (a device may leave and join again, on the same GPU).
* **Unplanned failure** (a process dies or fails, the others stop within the watchdog's bound):
  the failed device is dropped, the plan is re-planned on the survivors, every survivor is
  restarted (attempt ``a + 1``: a fresh store prefix) with ``--resume`` of the newest complete
  checkpoint under ``--checkpoint-dir`` (none: from step 0), and the supervisor says how many
  completed steps were lost. The rest of a trace continues without the failed device. At most
  ``max_restarts`` times; user errors and out-of-memory are not retried.

The job's exit code is that of :func:`hexiscale.launch.local.job_exit_code`.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from executor.job.watchdog import EXIT_INTERRUPTED, EXIT_OK, EXIT_RANK_FAILURE, Verdict
from executor.switch.elastic_channel import Channel, request_prefix
from hexiscale.launch.elastic_procs import DeviceProcess, Processes
from hexiscale.launch.local import describe_exit, job_exit_code
from planner.cluster import ClusterSpec
from planner.elastic_trace import Phase, Trace
from planner.errors import SpecError
from planner.plan import Plan, save_plan
from planner.replan import replan
from planner.varlen.layout_doc import Layout, home_plan
from planner.varlen.pool import StrategyPool
from planner.varlen.replan_pool import replan_pool

POLL_S = 0.1


def say(text: str) -> None:
    print(f"hexiscale launch: {text}", file=sys.stderr, flush=True)


@dataclass
class ElasticOptions:
    train_args: list[str]
    device: str = "cpu"
    run_id: str = "local"
    grace_s: float = 30.0
    ready_timeout_s: float = 600.0
    max_restarts: int = 3
    replan_time_s: float | None = None
    extra_env: dict[str, str] = field(default_factory=dict)
    report_jsonl: str | None = None  # one JSON line per switch and per recovery
    shares: dict[str, float] = field(default_factory=dict)  # device -> MPS share (--sm-percent)


@dataclass
class _Change:
    """A change under way: epoch ``e`` to ``plan`` (``request``: the request it answers)."""

    e: int
    plan: Layout  # a plan, or a strategy pool
    devices: list[str]  # the job's device set after the change (the plan may leave some idle)
    joining: list[str]
    request: int | None
    replan_s: float
    published: bool = False
    path: str = ""  # the layout's file (<run dir>/plan-<attempt>-<e>.json)

    @property
    def home(self) -> Plan:
        return home_plan(self.plan)


class Supervisor:
    def __init__(self, layout: Layout, cluster: ClusterSpec | None, opts: ElasticOptions, trace: Trace | None = None):
        from torch.distributed import TCPStore

        self.layout, self.cluster, self.opts, self.trace = layout, cluster, opts, trace
        plan = self.plan
        self.store = TCPStore("127.0.0.1", 0, world_size=None, is_master=True, wait_for_workers=False)
        self.dir = Path(tempfile.mkdtemp(prefix=f"hexiscale-elastic-{opts.run_id}-"))
        every = list(dict.fromkeys([*plan.devices, *(d for p in (trace.phases if trace else ()) for d in p.devices),
                                    *(d.id for d in (cluster.devices if cluster else ()))]))
        self.procs = Processes(port=self.store.port, run_id=opts.run_id, device_kind=opts.device,
                               gpu_index={d: i for i, d in enumerate(every)}, extra_env=opts.extra_env)
        self.requests = request_prefix(opts.run_id)
        self.handled = 0  # requests answered
        self.devices = list(plan.devices)  # the job's device set (a plan may leave some of it idle)
        self.attempt = 0
        self.lost: list[int] = []
        self.shares = dict(opts.shares, **(trace.phases[0].sm_percent if trace else {}))  # device -> MPS %

    @property
    def plan(self) -> Plan:
        """The running layout's plan (a pool's home plan): what numbers the ranks."""
        return home_plan(self.layout)

    # ------------------------------------------------------------------ the job
    def run(self) -> int:
        say(f"elastic job, {self.plan.world_size} ranks ({'GPU, nccl' if self.opts.device == 'cuda' else 'CPU, gloo'})"
            f"; store at 127.0.0.1:{self.store.port}; change it with: hexiscale elastic leave|join DEVICE... "
            f"--store 127.0.0.1:{self.store.port} --run-id {self.opts.run_id}")
        previous = signal.signal(signal.SIGTERM, _raise_interrupt)
        phases = list(self.trace.phases[1:]) if self.trace else []
        resume: str | None = None
        try:
            while True:
                code, failed = self._attempt(phases, resume)
                if code == EXIT_OK or failed is None:
                    return code
                recovered = self._recover(failed, phases)
                if recovered is None:
                    return code
                phases, resume = recovered
        except KeyboardInterrupt:
            self.procs.terminate()
            return EXIT_INTERRUPTED
        finally:
            signal.signal(signal.SIGTERM, previous)
            self.procs.join_output()

    def _attempt(self, phases: list[Phase], resume: str | None) -> tuple[int, DeviceProcess | None]:
        """Run the job until it ends; returns (exit code, the first failed process if any)."""
        channel = Channel(self.store, f"hexiscale/{self.opts.run_id}/{self.attempt}")
        self.channel, self.epoch = channel, 0
        start_step = _resume_step(resume)
        pending = [p for p in phases if p.start > start_step]
        for e, phase in enumerate(pending, start=1):
            channel.schedule(e, phase.start)
        args = list(self.opts.train_args) + (["--resume", resume] if resume else [])
        path = self._save(self.layout, 0)
        self.procs.start(self.plan, path, self.plan.devices, args, attempt=self.attempt,
                         fault=self._fault(), shares=self.shares)
        change: _Change | None = None
        first: DeviceProcess | None = None
        while True:
            now = time.monotonic()
            for p in self.procs.poll(now):
                if p.code != EXIT_OK and first is None:
                    if change is not None and p.device in change.joining and not change.published:
                        self._fail_change(change, f"{p.device} {describe_exit(p.code or 0)} before it was ready")
                        change = None
                        continue
                    first = p
            if first is not None:
                return self._stop(first), first
            if not self.procs.running() and change is None:
                return job_exit_code([p.code if p.code is not None else EXIT_RANK_FAILURE
                                      for p in self.procs.procs]), None
            change = self._advance(change, pending)
            time.sleep(POLL_S)

    # ------------------------------------------------------------------ changes
    def _advance(self, change: _Change | None, pending: list[Phase]) -> _Change | None:
        """One look at the change under way, or start the next one."""
        if change is None:
            return self._next_change(pending)
        if not change.published:
            ready = self.channel.readiness(change.e, change.joining)
            bad = {d: v for d, v in ready.items() if v != "ok"}
            if bad:
                d, why = next(iter(bad.items()))
                self._fail_change(change, f"{d} is not ready: {why}")
                return None
            if len(ready) == len(change.joining):
                self.channel.publish_epoch(change.e, self.layout, change.plan)
                change.published = True
                self._answer(change.request, "switching after the next step")
            return change
        report = self.channel.done(change.e)
        if report is None:
            return change
        report["replan_s"] = change.replan_s
        report["layout_file"] = change.path
        self._print_switch(change.e, report)
        for p in self.procs.procs:
            if p.code is None and p.device not in change.home.devices:
                p.leaving = True
        self._answer(change.request, f"ok: switched after step {report['step']} to {change.home.world_size} ranks "
                     f"in {report['switch_s']:.2f} s")
        self.layout, self.devices, self.epoch = change.plan, change.devices, change.e
        return None

    def _next_change(self, pending: list[Phase]) -> _Change | None:
        if any(p.leaving and p.code is None for p in self.procs.procs):
            return None  # a leaving device still runs: its GPU is not free yet
        e = self.epoch + 1
        if pending:
            if len(pending) < e:
                self._refuse_requests("the job follows a trace and it has ended")
                return None
            phase = pending[e - 1]
            t0 = time.perf_counter()
            plan: Layout = phase.plan if phase.plan is not None else self._replan(list(phase.devices))
            return self._begin(e, plan, list(phase.devices), None, time.perf_counter() - t0, phase.sm_percent)
        request = self._take_request()
        if request is None:
            return None
        n, leave, join = request
        try:
            devices = self._request_devices(leave, join)
            t0 = time.perf_counter()
            plan = self._replan(devices)
        except SpecError as exc:
            self._answer(n, f"error: {exc}")
            return None
        if _same(plan, self.layout):
            idle = [d for d in devices if d not in home_plan(plan).devices]
            self.devices = devices
            say(f"request {n}: the running plan stays best for {len(devices)} devices"
                + (f" (idle: {', '.join(idle)})" if idle else ""))
            self._answer(n, "ok: the running plan stays best; nothing to switch"
                         + (f" (idle: {', '.join(idle)})" if idle else ""))
            return None
        return self._begin(e, plan, devices, n, time.perf_counter() - t0, {})

    def _begin(self, e: int, layout: Layout, devices: list[str], request: int | None, replan_s: float,
               shares: dict[str, float]) -> _Change:
        plan = home_plan(layout)
        joining = [d for d in plan.devices if d not in self.plan.devices]
        idle = [d for d in devices if d not in plan.devices]
        self.channel.publish_plan(e, self.layout, layout)
        path = self._save(layout, e)
        say(f"epoch {e}: {self.plan.world_size} -> {plan.world_size} ranks (planned in {replan_s:.2f} s)"
            + (f"; starting {', '.join(joining)}" if joining else "")
            + (f"; idle under the new plan: {', '.join(idle)}" if idle else ""))
        self.shares.update(shares)
        self.procs.start(plan, path, joining, self.opts.train_args, attempt=self.attempt, epoch=e, shares=self.shares,
                         fault=self._fault())
        self._answer(request, f"planned epoch {e} ({plan.world_size} ranks); waiting for joining devices")
        return _Change(e, layout, devices, joining, request, replan_s, path=path)

    def _fail_change(self, change: _Change, why: str) -> None:
        """A joining device failed before the epoch was published: the job goes on unchanged (the
        epoch's number is used again by the next change), or, in a trace, stops."""
        self.procs.terminate([p for p in self.procs.procs if p.device in change.joining and p.epoch == change.e])
        self.channel.forget_ready(change.e, change.joining)
        if change.request is None:
            self.procs.terminate(self.procs.running())
            raise SpecError("trace", f"epoch {change.e}: {why}", "fix the joining device or the trace")
        self._answer(change.request, f"error: {why}")

    # ------------------------------------------------------------------ requests
    def _take_request(self) -> tuple[int, list[str], list[str]] | None:
        count = int(self.store.add(f"{self.requests}/request/count", 0))
        if count <= self.handled:
            return None
        self.handled += 1
        raw = self.store.get(f"{self.requests}/request/{self.handled}")
        rec = json.loads(raw)
        return self.handled, list(rec.get("leave", [])), list(rec.get("join", []))

    def _refuse_requests(self, why: str) -> None:
        while (req := self._take_request()) is not None:
            self._answer(req[0], f"error: {why}")

    def _request_devices(self, leave: list[str], join: list[str]) -> list[str]:
        if self.cluster is None:
            raise SpecError("--cluster", "re-planning needs the cluster file", "launch with --cluster")
        current = list(self.devices)
        for d in leave:
            if d not in current:
                raise SpecError("leave", f"{d} is not one of the job's devices ({', '.join(current)})",
                                "name one of those")
        for d in join:
            self.cluster.device(d, "join")
            if d in current:
                raise SpecError("join", f"{d} is already one of the job's devices", "name another device")
        devices = [d for d in current if d not in leave] + [d for d in join if d not in current]
        if not devices:
            raise SpecError("leave", "no device would be left", "keep at least one device")
        return devices

    def _answer(self, request: int | None, text: str) -> None:
        if request is not None:
            self.store.set(f"{self.requests}/request/{request}/status", text)

    # ------------------------------------------------------------------ failures
    def _stop(self, first: DeviceProcess) -> int:
        """Wait for the others to stop on their own (watchdog), then terminate what is left."""
        deadline = time.monotonic() + self.opts.grace_s
        while self.procs.running() and time.monotonic() < deadline:
            self.procs.poll(time.monotonic())
            time.sleep(POLL_S)
        if self.procs.running():
            say(f"ranks still running {self.opts.grace_s:.0f} s after {first.device} failed; stopping them")
            self.procs.terminate(self.procs.running())
        codes = [p.code if p.code is not None else EXIT_RANK_FAILURE for p in self.procs.procs]
        return job_exit_code(codes)

    def _recover(self, first: DeviceProcess, phases: list[Phase]) -> tuple[list[Phase], str | None] | None:
        code = job_exit_code([first.code or EXIT_RANK_FAILURE])
        if code != EXIT_RANK_FAILURE or self.attempt >= self.opts.max_restarts or self.cluster is None:
            why = ("no --cluster to re-plan with" if self.cluster is None else
                   f"{self.attempt} restarts done" if code == EXIT_RANK_FAILURE else f"exit code {code}")
            say(f"{first.device} {describe_exit(first.code or 0)}; not recovering ({why})")
            return None
        verdict = self._verdict()
        failed = first.device  # the first process to end is the one that failed (the others wait for it)
        done = verdict.step if verdict is not None else None
        survivors = [d for d in self.devices if d != failed]
        if not survivors:
            say(f"{failed} failed and no device is left")
            return None
        t0 = time.perf_counter()
        self.layout = self._replan(survivors)
        self.devices = survivors
        replan_s = time.perf_counter() - t0
        resume = self._newest_checkpoint()
        step = _resume_step(resume)
        lost = lost_steps(done, step) if done is not None else None
        self.lost.append(lost if lost is not None else -1)
        say(f"{failed} failed" + (f" at step {verdict.step} ({verdict.reason})" if verdict else "")
            + f"; re-planned on {len(survivors)} devices in {replan_s:.2f} s ({self.plan.world_size} ranks); "
            + (f"resuming from {resume} (step {step})" if resume else "restarting from step 0 (no checkpoint)")
            + (f"; {lost} completed step{'s' if lost != 1 else ''} lost" if lost is not None else ""))
        self._log({"event": "recovery", "failed": failed, "failed_step": verdict.step if verdict else None,
                   "resume_step": step, "lost_steps": lost, "replan_s": replan_s, "ranks": self.plan.world_size})
        self.attempt += 1
        self.procs.reset()
        rest = [Phase(p.start, p.steps, tuple(d for d in p.devices if d != failed),
                      p.plan if p.plan is None or failed not in home_plan(p.plan).devices else None, p.sm_percent)
                for p in phases]
        return rest, resume

    def _verdict(self) -> Verdict | None:
        """The job-wide verdict of the failure (its epoch's watchdog keys; the epoch may have just
        changed)."""
        base = self.channel.prefix.rsplit("/elastic", 1)[0]
        for e in (self.epoch + 1, self.epoch):
            key = f"{base}{f'/e{e}' if e else ''}/wd/abort"
            if self.store.check([key]):
                return Verdict.decode(self.store.get(key))
        return None

    def _newest_checkpoint(self) -> str | None:
        from executor.state.checkpoint_verify import find_checkpoint

        ckpt = _flag(self.opts.train_args, "--checkpoint-dir")
        if ckpt is None:
            return None
        try:
            return str(find_checkpoint(ckpt))
        except SpecError:
            return None

    # ------------------------------------------------------------------ helpers
    def _replan(self, devices: list[str]) -> Layout:
        if self.cluster is None:
            raise SpecError("--cluster", "re-planning needs the cluster file", "launch with --cluster")
        from planner.search.config import PlannerConfig

        cfg = None
        if self.opts.replan_time_s is not None:
            cfg = PlannerConfig(time_limit_s=self.opts.replan_time_s, dtype=self.plan.options.dtype,
                                compile=self.plan.options.compile,
                                residual_dtype=self.plan.options.residual_dtype)
        if isinstance(self.layout, StrategyPool):
            return replan_pool(self.cluster, devices, self.layout, config=cfg)
        return replan(self.cluster, devices, self.plan, config=cfg).plan

    def _save(self, layout: Layout, e: int) -> str:
        path = self.dir / f"plan-{self.attempt}-{e}.json"
        if isinstance(layout, StrategyPool):
            layout.save(path)
        else:
            save_plan(layout, path)
        return str(path)

    def _fault(self) -> str | None:
        return os.environ.get("HEXISCALE_FAULT") if self.attempt == 0 else None

    def _print_switch(self, e: int, r: dict[str, Any]) -> None:
        change = ", ".join(x for x in (f"leave {' '.join(r['leave'])}" if r["leave"] else "",
                                       f"join {' '.join(r['join'])}" if r["join"] else "") if x) or "re-plan"
        bound = f", lower bound {r['lower_bound_s'] * 1e3:.2f} ms" if "lower_bound_s" in r else ""
        say(f"epoch {e} after step {r['step']}: {r['old_ranks']} -> {r['new_ranks']} ranks ({change}); moved "
            f"{r['moved_bytes'] / 1e6:.2f} MB (kept {r['local_bytes'] / 1e6:.2f} MB local, "
            f"{r.get('adopted_bytes', 0) / 1e6:.2f} MB of it in place) in {r['switch_s']:.3f} s: "
            f"transfer {r['transfer_s'] * 1e3:.1f} ms{bound}, communicators {r['comm_s'] * 1e3:.0f} ms; "
            f"re-planned in {r['replan_s']:.2f} s while training"
            + (f"; waited {r['wait_s']:.1f} s for joining devices" if r["wait_s"] > 0.5 else ""))
        self._log(dict(r, event="switch", epoch=e))

    def _log(self, rec: dict[str, Any]) -> None:
        if self.opts.report_jsonl:
            with open(self.opts.report_jsonl, "a") as f:
                f.write(json.dumps(rec) + "\n")


def _same(a: Layout, b: Layout) -> bool:
    """The same layout for training (estimates and cluster names aside)."""
    if isinstance(a, StrategyPool) or isinstance(b, StrategyPool):
        if not (isinstance(a, StrategyPool) and isinstance(b, StrategyPool)) or len(a.strategies) != len(b.strategies):
            return False
        return a.home == b.home and all(_same(x.plan, y.plan) for x, y in zip(a.strategies, b.strategies))
    return (a.pipelines, a.options) == (b.pipelines, b.options)


def _flag(args: list[str], name: str) -> str | None:
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None


def lost_steps(failed_step: int, resume_step: int) -> int:
    """Completed steps a failure at ``failed_step`` (the verdict's: the dead rank's last heartbeat)
    loses when the job resumes from a checkpoint of ``resume_step``. The heartbeat can lag the
    training by a step or two under load, so a kill right after a save may report a step at or
    before the checkpoint's; the checkpoint proves its steps completed, so none is lost then (never
    a negative count)."""
    return max(0, failed_step - 1 - resume_step)


def _resume_step(resume: str | None) -> int:
    if resume is None:
        return 0
    from executor.state.checkpoint import read_meta

    return int(read_meta(resume)["step"])


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt
