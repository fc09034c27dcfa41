"""The profiling run: the grid of points, the catalog entry it fills, the progress bar.

GPU mode measures the model's layer over micro-batch sizes, sequence lengths and TP shard shapes; CPU mode
runs the same path on tiny shapes with few repeats (for tests and CI). Points already in the output file
are skipped, so a run can be interrupted and started again.

``live_tps`` adds live TP layer rows (``"collectives": true``): the layer on ``t`` ranks with its real
all-reduces, at the model's sequence length and every micro-batch of the grid
(:mod:`executor.profiler.live_tp`), for each ``t`` this host has the devices for (``t`` GPUs; gloo
processes on the CPU). They are measured together, in one set of rank processes, after the
shard-only points.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from executor.profiler import compute
from executor.profiler.comm import measure_comm
from executor.profiler.live_tp import live_points, measure_live_layers
from executor.profiler.store import MEASURED_FORMAT, TABLE_KEYS, ProfileFile
from planner.catalog import Catalog, DeviceType, default_catalog
from planner.cost.pass_times import DEVICE_TIMES, FULL_QUEUE
from planner.errors import SpecError
from planner.model import ModelSpec


@dataclass
class ProfileConfig:
    model: ModelSpec
    dtype: str = "bf16"
    micro_batches: list[int] = field(default_factory=lambda: [1, 2, 4])
    seq_lens: list[int] = field(default_factory=lambda: [1024, 2048, 4096])
    tps: list[int] = field(default_factory=lambda: [1, 2, 4])
    recompute_points: list[tuple[int, int]] = field(default_factory=list)  # (micro_batch, tp) at model seq
    head_seq_lens: list[int] = field(default_factory=list)  # default: the model's seq_len
    optimizer_layers: list[int] = field(default_factory=lambda: [1, 4])
    warmup: int = 3
    repeats: int = 10
    comm_world: int = 0  # 0: no communication sweep
    comm_sizes: list[int] = field(default_factory=list)
    cpu: bool = False
    sm_percent: float | None = None
    gemm_dim: int = 8192
    copy_mib: int = 1024
    layer_chain: int = 1  # layers timed back to back per measurement (see compute.measure_layer)
    live_tps: list[int] = field(default_factory=list)  # TP degrees timed live on t ranks (executor.profiler.live_tp)

    def valid_tps(self, tps: list[int] | None = None) -> list[int]:
        m = self.model
        return [t for t in (self.tps if tps is None else tps) if m.num_heads % t == 0 and m.num_kv_heads % t == 0
                and m.vocab_size % t == 0 and m.ffn_hidden_size % t == 0]

    def available_live_tps(self) -> list[int]:
        """``live_tps`` that shard the model and that this host can run: ``t`` local GPUs, or gloo
        processes on the CPU."""
        have = None if self.cpu else (torch.cuda.device_count() if torch.cuda.is_available() else 0)
        return [t for t in self.valid_tps(self.live_tps) if t >= 2 and (have is None or have >= t)]


def default_config(model: ModelSpec, *, cpu: bool, sm_percent: float | None = None,
                   comm_world: int = 0) -> ProfileConfig:
    """The standard grid: GPU sizes around the model's sequence length, or tiny CPU shapes."""
    if cpu:
        return ProfileConfig(model=model, dtype="fp32", micro_batches=[1, 2], seq_lens=[16, model.seq_len],
                             tps=[1, 2], recompute_points=[(1, 1)], optimizer_layers=[1, 2], warmup=1, repeats=2,
                             comm_world=comm_world, comm_sizes=[2**10, 2**14, 2**17], cpu=True,
                             sm_percent=sm_percent, gemm_dim=128, copy_mib=4)
    s = model.seq_len
    return ProfileConfig(model=model, seq_lens=sorted({max(128, s // 2), s, 2 * s}), recompute_points=[(1, 1), (2, 1)],
                         comm_world=comm_world, comm_sizes=[4**k for k in range(6, 15)], sm_percent=sm_percent,
                         layer_chain=4)


# ------------------------------------------------------------------------------------------ metadata


def _driver() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=False)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def machine_meta(cfg: ProfileConfig) -> dict[str, Any]:
    """GPU name, driver, torch/CUDA versions, date, and the MPS SM percentage if throttled."""
    cuda = not cfg.cpu and torch.cuda.is_available()
    sm = cfg.sm_percent
    if sm is None and os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"):
        sm = float(os.environ["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"])
    return {
        "gpu_name": torch.cuda.get_device_name(0) if cuda else f"cpu ({platform.processor() or platform.machine()})",
        "driver": _driver() if cuda else "n/a",
        "torch": torch.__version__,
        "cuda": torch.version.cuda if cuda else None,
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "sm_percent": sm,
        "mode": "gpu" if cuda else "cpu",
        "device_count": torch.cuda.device_count() if cuda else 0,
        "multiprocessors": torch.cuda.get_device_properties(0).multi_processor_count if cuda else None,
        # F.rms_norm (executor.model.fast_path) is one fused kernel on CUDA, which saves less for the
        # backward than the CPU composite: the activation rows say which (CostParams.fused_rms_norm)
        "fused_rms_norm": cuda,
        # CUDA rows time the device from a full queue, host-free, beside the host's issue time
        # (executor.profiler.timing.phase_times); the planner prices max(device, host) per pass
        **({DEVICE_TIMES: FULL_QUEUE} if cuda else {}),
    }


BASE_BY_NAME = (("h100", "sxm", "h100-sxm"), ("h100", "hbm3", "h100-sxm"), ("h100", "pcie", "h100-pcie"),
                ("h200", "", "h100-sxm"), ("a100", "sxm", "a100-sxm-80g"), ("4090", "", "rtx4090"),
                ("3090", "", "rtx3090"))


def detect_base(gpu_name: str, catalog: Catalog) -> DeviceType | None:
    low = gpu_name.lower()
    for a, b, key in BASE_BY_NAME:
        if a in low and b in low and key in catalog:
            return catalog.get(key)
    return None


def fresh_entry(cfg: ProfileConfig, meta: dict[str, Any], key: str, base: DeviceType | None) -> dict[str, Any]:
    """A catalog entry for the measured device. Peaks are the base type's datasheet figures scaled by the
    SM share (MPS limits the SMs a process may use); the measured ceilings sit in ``measured.ceilings``."""
    share = (meta["sm_percent"] or 100.0) / 100.0
    if base is not None:
        peaks = {k: round(v * share, 2) for k, v in base.peak_tflops.items()}
        bw, mem, name = base.memory_bandwidth_GBps, base.memory_gib, base.name
    else:  # CPU mode or an unknown GPU: nominal figures, to be read with the measured tables
        peaks, bw, mem, name = {"bf16": 1.0, "fp32": 1.0}, 50.0, 16.0, meta["gpu_name"]
    if meta["mode"] == "gpu":
        mem = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 2)
    sm_note = f" under MPS with {meta['sm_percent']:g} % of the SMs" if meta["sm_percent"] else ""
    entry: dict[str, Any] = {
        "key": key,
        "name": f"{name}{sm_note} (measured)",
        "memory_gib": mem,
        "peak_tflops": peaks,
        "memory_bandwidth_GBps": bw,
        "source": f"measured by 'hexiscale profile' on {meta['gpu_name']} (driver {meta['driver']}, "
                  f"torch {meta['torch']}) on {meta['date'][:10]}",
        "derived": "measured",
        "notes": "Tables under 'measured' are timings of the executor's own modules; peak_tflops are the base "
                 "type's datasheet figures scaled by the SM share (a spec fallback for shapes off the tables).",
        "measured": {"format": MEASURED_FORMAT, "meta": meta, "model": cfg.model.to_dict(), "dtype": cfg.dtype},
    }
    if meta["sm_percent"]:
        entry["sm_percent"] = meta["sm_percent"]
    if base is not None:
        entry["base"] = base.key
    return entry


# ------------------------------------------------------------------------------------------ the run


def plan_points(cfg: ProfileConfig) -> list[tuple[str, dict[str, Any]]]:
    s = cfg.model.seq_len
    pts: list[tuple[str, dict[str, Any]]] = []
    for tp in cfg.valid_tps():
        for seq in cfg.seq_lens:
            for mb in cfg.micro_batches:
                pts.append(("layer", {"micro_batch": mb, "seq_len": seq, "tp": tp, "recompute": "none"}))
    for mb, tp in cfg.recompute_points:
        for rc in ("selective", "full"):
            pts.append(("layer", {"micro_batch": mb, "seq_len": s, "tp": tp, "recompute": rc}))
    for tp in cfg.valid_tps():
        for seq in cfg.head_seq_lens or [s]:
            for mb in cfg.micro_batches:
                pts.append(("embedding", {"micro_batch": mb, "seq_len": seq, "tp": tp}))
                pts.append(("head", {"micro_batch": mb, "seq_len": seq, "tp": tp}))
    for tp in cfg.valid_tps():
        for n in cfg.optimizer_layers:
            pts.append(("optimizer", {"layers": n, "tp": tp}))
    pts += [("layer", p) for p in live_points(cfg.model, cfg.available_live_tps(), cfg.micro_batches)]
    return pts


def _measure(table: str, point: dict[str, Any], cfg: ProfileConfig, device: torch.device) -> dict[str, Any]:
    common: dict[str, Any] = {"device": device, "warmup": cfg.warmup, "repeats": cfg.repeats}
    if table == "layer":
        return compute.measure_layer(cfg.model, dtype=cfg.dtype, chain=cfg.layer_chain, **point, **common)
    if table == "embedding":
        return compute.measure_embedding(cfg.model, dtype=cfg.dtype, **point, **common)
    if table == "head":
        return compute.measure_head(cfg.model, dtype=cfg.dtype, **point, **common)
    if table == "optimizer":
        return compute.measure_optimizer(cfg.model, **point, **common)
    raise ValueError(table)


def run_profile(cfg: ProfileConfig, out: Path, *, key: str | None = None, base: str | None = None,
                resume: bool = True, progress: bool = True,
                on_point: Callable[[str, dict[str, Any], dict[str, Any]], None] | None = None) -> ProfileFile:
    """Measure every point of ``cfg`` not yet in ``out`` and write ``out`` after each one."""
    if not cfg.cpu and not torch.cuda.is_available():
        raise SpecError("--cpu", "no CUDA device is available", "pass --cpu for the tiny CPU profile")
    device = torch.device("cpu") if cfg.cpu else torch.device("cuda", 0)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    meta = machine_meta(cfg)
    catalog = default_catalog()
    base_type = catalog.get(base, "--base") if base else (None if cfg.cpu else detect_base(meta["gpu_name"], catalog))
    entry_key = key or out.stem
    pf = ProfileFile.open(out, fresh_entry(cfg, meta, entry_key, base_type), resume=resume)
    todo = [(t, p) for t, p in plan_points(cfg) if not pf.has(t, p)]
    live = [p for _, p in todo if p.get("collectives")]
    todo = [(t, p) for t, p in todo if not p.get("collectives")]
    need_ceilings = "ceilings" not in pf.measured
    need_comm = cfg.comm_world >= 2 and "comm" not in pf.measured
    total = len(todo) + len(live) + need_ceilings + need_comm

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description:<44}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  disable=not progress, transient=False) as bar:
        task = bar.add_task(f"profiling {entry_key}", total=total)
        if need_ceilings:
            bar.update(task, description="ceilings (GEMM, copy)")
            pf.set("ceilings", compute.measure_ceilings(device, cfg.dtype, gemm_dim=cfg.gemm_dim,
                                                        copy_mib=cfg.copy_mib, warmup=cfg.warmup,
                                                        repeats=cfg.repeats))
            bar.advance(task)
        for table, point in todo:
            bar.update(task, description=f"{table} " + " ".join(f"{k}={v}" for k, v in point.items()))
            result = _measure(table, point, cfg, device)
            pf.add(table, point, result)
            if on_point is not None:
                on_point(table, point, result)
            if device.type == "cuda":
                torch.cuda.empty_cache()
            bar.advance(task)
        if live:
            bar.update(task, description="layer live TP " + ", ".join(str(t) for t in sorted({p["tp"] for p in live}))
                       + " (ranks with their all-reduces)")
            for row in measure_live_layers(cfg.model, live, cpu=cfg.cpu, dtype=cfg.dtype, warmup=cfg.warmup,
                                           repeats=cfg.repeats, chain=cfg.layer_chain, sm_percent=cfg.sm_percent):
                point = {k: row[k] for k in (*TABLE_KEYS["layer"], "collectives")}
                pf.add("layer", point, {k: v for k, v in row.items() if k not in point})
                if on_point is not None:
                    on_point("layer", point, row)
                bar.advance(task)
        if need_comm:
            bar.update(task, description=f"p2p / all-reduce over {cfg.comm_world} ranks")
            with tempfile.TemporaryDirectory() as tmp:
                sms: list[float | None] | None = [cfg.sm_percent] * cfg.comm_world if cfg.sm_percent else None
                pf.set("comm", measure_comm(cfg.comm_world, cfg.comm_sizes, cpu=cfg.cpu,
                                            out_file=Path(tmp) / "comm.json", sm_percents=sms))
            bar.advance(task)
    return pf
