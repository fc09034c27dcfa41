"""The processes of an elastic job on this machine: one ``hexiscale train`` per device, keyed by
device id (its rank changes from epoch to epoch; its GPU does not).

Each process gets the launcher environment of :func:`hexiscale.launch.local.run_local` for its
rank in the plan it starts with, plus ``HEXISCALE_ELASTIC=1``, ``HEXISCALE_DEVICE`` (its device
id), ``LOCAL_RANK`` = the device's fixed GPU index (its position among the job's devices, so a
device keeps its GPU whatever its rank), ``TORCHELASTIC_RESTART_COUNT`` = the attempt (its store
prefix, :mod:`executor.job.env`), ``HEXISCALE_ELASTIC_JOIN=e`` for a device joining at epoch
``e``, and ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` where the trace gives it an SM share. Output is
forwarded line by line; only these processes are ever signalled, by pid.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from hexiscale.launch.fork_spawn import spawn_mode
from hexiscale.launch.local import RankProcess, _pump, _terminate, rank_argv, start_rank
from planner.plan import Plan


@dataclass
class DeviceProcess(RankProcess):
    device: str = ""
    epoch: int = 0  # the epoch it started in
    leaving: bool = False  # handed its state over (exits 0 on its own)


class Processes:
    def __init__(self, *, port: int, run_id: str, device_kind: str, gpu_index: dict[str, int],
                 extra_env: dict[str, str] | None = None):
        base = dict(os.environ)
        base.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "HEXISCALE_STORE_HOSTED": "1",
                     "HEXISCALE_RUN_ID": run_id, "HEXISCALE_NODE": "local", "PYTHONUNBUFFERED": "1",
                     "HEXISCALE_ELASTIC": "1", "LOCAL_WORLD_SIZE": str(len(gpu_index))})
        for key in ("HEXISCALE_NODE_RANKS", "HEXISCALE_ELASTIC_JOIN", "HEXISCALE_DEVICE"):
            base.pop(key, None)
        if device_kind == "cpu":
            base["CUDA_VISIBLE_DEVICES"] = ""
            base.setdefault("OMP_NUM_THREADS", "1")
        else:  # a switch connects new NCCL peers mid-run: legacy CUDA IPC buffers connect an NVLink pair in
            # 23-37 ms against cuMem's 186-292 ms (p2p_connect, 4x H100, 2026-11-27); a user's setting wins
            base.setdefault("NCCL_CUMEM_ENABLE", "0")
        base.update(extra_env or {})
        self.base = base
        self.device_kind = device_kind
        self.gpu_index = gpu_index
        self.procs: list[DeviceProcess] = []
        self.pumps: list[threading.Thread] = []

    def start(self, plan: Plan, plan_path: str, devices: Sequence[str], train_args: Sequence[str], *, attempt: int,
              epoch: int = 0, shares: dict[str, float] | None = None, fault: str | None = None) -> None:
        """Start ``devices`` of ``plan`` (all of them at epoch 0; the joining ones later)."""
        cmd = rank_argv(plan_path, self.device_kind, train_args)
        mode = spawn_mode(self.device_kind, self.base)
        for dev in devices:
            env = dict(self.base, RANK=str(plan.devices.index(dev)), WORLD_SIZE=str(plan.world_size),
                       LOCAL_RANK=str(self.gpu_index[dev]), HEXISCALE_DEVICE=dev,
                       TORCHELASTIC_RESTART_COUNT=str(attempt))
            env.pop("HEXISCALE_FAULT", None)
            if fault:
                env["HEXISCALE_FAULT"] = fault
            if epoch:
                env["HEXISCALE_ELASTIC_JOIN"] = str(epoch)
                env["HEXISCALE_STARTED_AT"] = f"{time.time():.3f}"  # the joiner reports its start-up from here
            if shares and dev in shares:
                env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = f"{shares[dev]:g}"
            proc = start_rank(cmd, env, mode)
            self.procs.append(DeviceProcess(plan.devices.index(dev), proc, device=dev, epoch=epoch))
            assert proc.stdout is not None
            t = threading.Thread(target=_pump, args=(proc.stdout, None), daemon=True)
            t.start()
            self.pumps.append(t)

    def poll(self, now: float) -> list[DeviceProcess]:
        """Processes that ended since the last poll."""
        ended = []
        for p in self.procs:
            if p.code is None and (code := p.proc.poll()) is not None:
                p.code, p.ended_at = code, now
                ended.append(p)
        return ended

    def running(self) -> list[DeviceProcess]:
        return [p for p in self.procs if p.code is None]

    def of(self, device: str) -> DeviceProcess | None:
        """The live process of ``device``, if any."""
        return next((p for p in self.procs if p.device == device and p.code is None), None)

    def terminate(self, procs: Sequence[DeviceProcess] | None = None) -> None:
        _terminate(list(procs if procs is not None else self.procs))

    def reset(self) -> None:
        """Forget the processes of an attempt that ended (all of them have exited)."""
        self.procs = [p for p in self.procs if p.code is None]

    def join_output(self) -> None:
        for t in self.pumps:
            t.join(timeout=5)
        self.pumps.clear()
