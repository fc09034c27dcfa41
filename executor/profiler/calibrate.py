"""``hexiscale calibrate``: measure the few figures that set most of the cost model on this host, in
minutes, and write a measured device entry and a calibration that ``plan``, ``estimate`` and
``whatif`` then use by default (:mod:`planner.calibration.local`).

What is measured (one GPU; the link sweep over every local GPU):

* the model's layer, embedding and head at the planner's points: micro-batches 1, 2, 4 at the
  model's sequence length, every TP shard shape up to 4, selective and full recompute at two
  points; the optimizer step; the large-GEMM and device-copy ceilings (the tables the planner
  reads, chained layers as inside a stage);
* the layer at TP 2 and 4 live, where the host has the GPUs (gloo processes at TP 2 on the CPU):
  ``t`` ranks with their real all-reduces, the slowest rank's figure, at the same micro-batches
  (rows flagged ``"collectives": true``, :mod:`executor.profiler.live_tp`). The cost model prices a
  TP stage from them and adds none of the layer's all-reduces again (the shard-only rows plus the
  link model under-predicted host-bound TP 2 passes by ~3x per layer on 4 x H200); the roofline fit
  does not see them;
* the layer of two more model widths (``WIDTHS``), micro-batches 1 and 2: the GEMM and attention
  shape terms of the roofline are only identifiable across widths, and the roofline is what
  answers for any model other than the profiled one;
* the layer on packed rows (documents of mixed length, the executor's packed attention,
  :mod:`executor.profiler.packed`): the varlen cost ``a·Σs² + b·Σs + c`` is fitted to them
  (:mod:`planner.calibration.packed`);
* on CUDA, one layer point eager and ``torch.compile``'d (:mod:`executor.profiler.compiled`): the
  compiled/eager ratio that prices ``options.compile`` (``compiled_layer_ratio``);
* on CUDA, one CP rank's attention at 32K over 2 ranks (:mod:`executor.profiler.cp_attention`):
  ``cp_attention_efficiency`` (:mod:`planner.calibration.cp_attention`);
* the p2p / all-reduce sweep between local GPUs (``link_efficiency`` against the NVLink nominal) and
  the host cost of issuing one TP all-reduce as the executor does (``collective_host_s``, then
  refitted to the live TP rows where there are some: :mod:`planner.calibration.collective`).

Then the roofline's compute terms are fitted to all of it (:func:`planner.calibration.fit.fit_compute`),
the link efficiency to the sweep, ``framework_gib`` is this process's CUDA context, and the
memory terms start from the packaged calibration of the same GPU when there is one.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import platform
import shutil
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch

from executor.model import allocator
from executor.profiler import compute
from executor.profiler.compiled import compiled_ratio
from executor.profiler.cp_attention import measure_cp_attention
from executor.profiler.packed import measure_packed_layer, packed_kernel, packed_rows, row_totals
from executor.profiler.runner import ProfileConfig, detect_base, machine_meta, run_profile
from planner.calibration.collective import fit_collective_host
from planner.calibration.cp_attention import fit_cp_attention
from planner.calibration.fit import fit_compute, fit_link_efficiency
from planner.calibration.holdout import DEFAULT_MAX_MEAN, gate, held_out_compute
from planner.calibration.local import calibrations
from planner.calibration.packed import LEFT_OUT, MIN_ROW_TOKENS, packed_fit, packed_gate
from planner.calibration.store import load_params, save_calibration
from planner.catalog import DeviceType, default_catalog, parse_device_entry
from planner.cluster import Link
from planner.cost.params import DEFAULT_PARAMS, CostParams
from planner.cost.pass_times import DEVICE_TIMES
from planner.cost.profile import SpecProfile
from planner.model import PRESETS, ModelSpec

ROW_POINT = ("tp", "micro_batch", "seq_len", "recompute", "collectives")  # a layer row's point, as reported
WIDTHS = ("llama2-7b", "llama2-13b")  # besides the model: layers timed for the shape terms only
CPU_WIDTHS = (ModelSpec("cpu-w96", 1, 96, 256, 4, 2, 256, 32), ModelSpec("cpu-w128", 1, 128, 352, 4, 2, 256, 32))
NVLINK_NOMINAL_GBPS = 450.0  # H100/H200 SXM NVLink 4 per direction: the nominal the cluster files use
MEASURED_KEY_BY_NAME = (("h200", "h200-measured"), ("h100", "h100-sxm-measured"))


def measured_key(gpu_name: str, base: str | None, sm_percent: float | None = None) -> str:
    """The catalog key this host's measured entry replaces (the twin a cluster's GPU type is planned with).
    Under an MPS share below 100 % it is the share's type plus ``-measured`` (``h100-sxm-mps50-measured``
    for the type ``h100-sxm-mps50`` a cluster names), so the share never overwrites the full GPU's entry."""
    low = gpu_name.lower()
    full = next((key for part, key in MEASURED_KEY_BY_NAME if part in low),
                f"{base}-measured" if base else "local-measured")
    if sm_percent is None or sm_percent >= 100:
        return full
    return f"{share_type(full.removesuffix('-measured'), sm_percent)}-measured"


def share_type(gpu_type: str, sm_percent: float) -> str:
    """The catalog type of ``gpu_type`` limited to ``sm_percent`` % of its SMs (``h100-sxm-mps50``)."""
    return gpu_type if sm_percent >= 100 else f"{gpu_type}-mps{sm_percent:g}"


def host_fingerprint() -> str:
    """Host name and the GPUs' UUIDs, hashed: tells a calibration of this machine from another's."""
    uuids = []
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            uuids.append(str(getattr(torch.cuda.get_device_properties(i), "uuid", i)))
    raw = "|".join([platform.node(), *uuids])
    return f"{platform.node()}:{hashlib.sha256(raw.encode()).hexdigest()[:12]}"


def quick_config(model: ModelSpec, *, cpu: bool, comm_world: int) -> ProfileConfig:
    if cpu:
        return ProfileConfig(model=model, dtype="fp32", micro_batches=[1, 2], seq_lens=[model.seq_len], tps=[1, 2],
                             recompute_points=[(1, 1)], optimizer_layers=[1, 2], warmup=1, repeats=2,
                             comm_world=comm_world, comm_sizes=[2**10, 2**14], cpu=True, gemm_dim=128, copy_mib=4,
                             live_tps=[2])
    # three micro-batches per recompute mode: the held-out check leaves one out, and a mode's term
    # (the checkpoint's host time) fitted to one remaining point missed the other by ~20 % on 4x H100
    return ProfileConfig(model=model, micro_batches=[1, 2, 4], seq_lens=[model.seq_len], tps=[1, 2, 4],
                         recompute_points=[(1, 1), (2, 1), (4, 1)], optimizer_layers=[1, 4], warmup=2, repeats=5,
                         comm_world=comm_world, comm_sizes=[4**k for k in range(8, 15)], layer_chain=4,
                         live_tps=[2, 4])


def _widths(cfg: ProfileConfig, device: torch.device, cpu: bool) -> list[dict[str, Any]]:
    models = CPU_WIDTHS if cpu else tuple(PRESETS[n] for n in WIDTHS)
    out = []
    for m in models:
        if m.hidden_size == cfg.model.hidden_size:
            continue
        m = replace(m, seq_len=cfg.model.seq_len)
        rows = []
        for mb in (1, 2):
            res = compute.measure_layer(m, micro_batch=mb, seq_len=m.seq_len, tp=1, recompute="none", dtype=cfg.dtype,
                                        device=device, warmup=cfg.warmup, repeats=cfg.repeats, chain=cfg.layer_chain)
            rows.append({"micro_batch": mb, "seq_len": m.seq_len, "tp": 1, "recompute": "none", **res})
            if device.type == "cuda":
                torch.cuda.empty_cache()
        out.append({"model": m.to_dict(), "layer": rows})
    return out


def _start_params(keys: list[str]) -> tuple[CostParams, str | None]:
    """The packaged calibration of this GPU type (its memory and link terms), else the defaults."""
    for cal in calibrations():
        if not cal.host and any(k in cal.applies_to for k in keys):
            return load_params(cal.path), str(cal.path)
    return DEFAULT_PARAMS, None


def _applies_to(key: str, base: DeviceType | None, sm_percent: float | None) -> list[str]:
    """The measured key and the cluster type it plans: ``h100-sxm`` for ``h100-sxm-measured``, the share's
    type (``h100-sxm-mps50``) for a share's key."""
    planned = key.removesuffix("-measured")
    if base is not None and (planned == base.key or (sm_percent is not None and sm_percent < 100)):
        return [key, planned]
    return [key]


def run_calibrate(model: ModelSpec, home: Path, *, cpu: bool, comm_world: int, progress: bool = True,
                  max_held_out: float = DEFAULT_MAX_MEAN, force: bool = False) -> dict[str, Any]:
    """Measure, fit and write ``home/devices/<key>.json`` and ``home/calibration/<key>.json``; returns a
    summary. Both are measured into a staging folder and installed only when the compute fit's held-out
    error (:mod:`planner.calibration.holdout`) is within ``max_held_out`` or ``force`` is set; otherwise
    ``summary["refused"]`` says why and ``home`` is left as it was. The packed fit is gated on its own
    (:func:`planner.calibration.packed.packed_gate`, same limit): above it, the rest installs and the
    packed rows are marked left out (``summary["packed_left_out"]`` and ``fits.packed.left_out`` say why)."""
    staging = Path(tempfile.mkdtemp(prefix=".calibrate-", dir=_made(home)))
    try:
        return _measure_and_fit(model, home, staging, cpu=cpu, comm_world=comm_world, progress=progress,
                                max_held_out=max_held_out, force=force)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _made(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _measure_and_fit(model: ModelSpec, home: Path, staging: Path, *, cpu: bool, comm_world: int, progress: bool,
                     max_held_out: float, force: bool) -> dict[str, Any]:
    t0 = time.perf_counter()
    allocator.use_default()  # measure under the allocator setting training runs with
    device = torch.device("cpu") if cpu else torch.device("cuda", 0)
    context_gib = 0.0
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.zeros(1, device=device)
        free, total = torch.cuda.mem_get_info(device)
        context_gib = (total - free) / 2**30
    cfg = quick_config(model, cpu=cpu, comm_world=comm_world)
    meta = machine_meta(cfg)
    base = None if cpu else detect_base(meta["gpu_name"], default_catalog())
    key = "cpu-measured" if cpu else measured_key(meta["gpu_name"], base.key if base else None, meta["sm_percent"])
    out = staging / "devices" / f"{key}.json"
    pf = run_profile(cfg, out, key=key, base=base.key if base else None, resume=False, progress=progress)
    pf.set("widths", _widths(cfg, device, cpu))
    rows = packed_rows(model.seq_len, row_totals(model.seq_len, model.seq_len if cpu else MIN_ROW_TOKENS))
    pf.set("packed", {"tp": 1, "recompute": "none", "kernel": packed_kernel(cfg.dtype, device),
                      "rows": measure_packed_layer(model, rows, dtype=cfg.dtype, device=device, warmup=cfg.warmup,
                                                   repeats=cfg.repeats, chain=cfg.layer_chain)})
    entry = parse_device_entry(json.loads(out.read_text()), str(out))
    applies = _applies_to(key, base, None if cpu else meta["sm_percent"])
    start, started_from = _start_params(applies)
    res = fit_compute(entry, start)
    held = held_out_compute(entry, start)
    refused = gate(held, max_held_out)
    params = res.params
    packed = packed_fit(SpecProfile(entry, params), model, cfg.dtype)
    gated = {**held.to_dict(), "limit_mean_abs_rel": max_held_out, "forced": force and refused is not None}
    fits: dict[str, Any] = {"compute": {**res.to_dict(), "held_out": gated, "device": key,
                                        "widths": [w["model"]["name"] for w in pf.measured["widths"]]}}
    packed_refused = packed_gate(packed, max_held_out) if packed is not None else None
    left_out = None if force else packed_refused
    if packed is not None:  # what the varlen cost will be priced from (planner.varlen.seq_cost), gated
        fits["packed"] = {**asdict(packed), "limit_mean_abs_rel": max_held_out,
                          "forced": force and packed_refused is not None, "left_out": left_out}
    if left_out is not None:  # the rows stay for inspection; marked, they price nothing (packed_fit: None)
        pf.set("packed", {**pf.measured["packed"], LEFT_OUT: left_out})
    comm = pf.measured.get("comm")
    if comm and comm.get("fit"):
        link = fit_link_efficiency(comm, NVLINK_NOMINAL_GBPS)
        params = replace(params, link_efficiency=link["link_efficiency"])
        fits["link"] = {**link, "nominal_GBps": NVLINK_NOMINAL_GBPS}
    if comm and comm.get("tp_issue_s", 0) > 0:  # host cost of one TP collective as the executor issues it
        params = replace(params, collective_host_s=float(comm["tp_issue_s"]))
        fits["collective_host"] = {"measured_s": float(comm["tp_issue_s"]), "world": comm.get("world")}
    if "link" in fits:  # ... and as a live TP layer pays it (planner.calibration.collective)
        live_fit = fit_collective_host(entry, params, Link("nvlink", NVLINK_NOMINAL_GBPS, fits["link"]["latency_us"]))
        if live_fit is not None:
            params = live_fit.params
            fits["collective_host"] = {**fits.get("collective_host", {}), "fitted_s": params.collective_host_s,
                                       "live_rows": live_fit.to_dict()}
    if device.type == "cuda":  # the executor compiles on CUDA only: a CPU calibration leaves it unmeasured
        comp = compiled_ratio(model, micro_batch=2, dtype=cfg.dtype, device=device, warmup=cfg.warmup,
                              repeats=cfg.repeats, chain=cfg.layer_chain)
        params = replace(params, compiled_layer_ratio=comp["ratio"],
                         compiled_device_ratio=comp.get("device_ratio", 0.0),
                         compiled_host_ratio=comp.get("host_ratio", 0.0))
        fits["compile"] = comp
    if device.type == "cuda" and base is not None:  # context parallelism's attention (CUDA's piece kernels)
        cpa = measure_cp_attention(model, dtype=cfg.dtype, device=device, warmup=cfg.warmup, repeats=cfg.repeats)
        if cpa is not None:
            cp_fit = fit_cp_attention(cpa["seconds"], model, base, params, seq_len=cpa["seq_len"], cp=cpa["cp"],
                                      dtype=cfg.dtype)
            params = replace(params, cp_attention_efficiency=cp_fit.efficiency)
            fits["cp_attention"] = {**cpa, **asdict(cp_fit)}
        torch.cuda.empty_cache()
    if context_gib > 0:
        params = replace(params, framework_gib=context_gib)
        fits["framework_gib"] = {"measured_context_gib": context_gib}
    elapsed = time.perf_counter() - t0
    provenance = {**{k: meta[k] for k in ("gpu_name", "driver", "torch", "cuda", "device_count")},
                  "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                  "host_fingerprint": host_fingerprint(), "model": model.name, "seconds": round(elapsed, 1),
                  "started_from": started_from}
    cal_path = staging / "calibration" / f"{key}.json"
    save_calibration(cal_path, params, fitted={**res.terms, **({"link_efficiency": params.link_efficiency}
                                                                if "link" in fits else {}),
                                               **({"collective_host_s": params.collective_host_s}
                                                  if "collective_host" in fits else {}),
                                               **({"compiled_layer_ratio": params.compiled_layer_ratio,
                                                   "compiled_device_ratio": params.compiled_device_ratio,
                                                   "compiled_host_ratio": params.compiled_host_ratio}
                                                  if "compile" in fits else {}),
                                               **({"cp_attention_efficiency": params.cp_attention_efficiency}
                                                  if "cp_attention" in fits else {})},
                     fits=fits, provenance=provenance, applies_to=applies)
    live = sorted({r["tp"] for r in pf.measured.get("layer", []) if r.get("collectives")})
    summary = {"key": key, "profile": str(home / "devices" / out.name),
               "calibration": str(home / "calibration" / cal_path.name), "seconds": elapsed, "fits": fits,
               "provenance": provenance, "live_tps": live, "refused": None if force else refused,
               "forced": gated["forced"], "packed_left_out": left_out,
               # what the layer rows timed: device (host-free on CUDA) and host apart, for the run's report
               "device_times": pf.measured["meta"].get(DEVICE_TIMES),
               "layer_rows": [{k: r[k] for k in (*ROW_POINT, *compute.TIME_KEYS) if k in r}
                              for r in pf.measured.get("layer", [])]}
    if summary["refused"] is None:  # install: the measured entry and its calibration, each replaced whole
        for staged in (out, cal_path):
            target = _made(home / staged.parent.name) / staged.name
            os.replace(staged, target)
    return summary
