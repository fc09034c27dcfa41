"""Whether a calibrated MPS share's layer is as much slower than the whole GPU's as the device can show
(tests/gpu/test_calibrate_share_gpu.py; pure, so its CPU test, tests/profiler/test_share_speed.py, holds
it to the figures of 2026-11-27).

A layer row's time was the device's only where the host issued the work faster than the device ran it;
where the host was slower (launch-bound), the row timed the host's issue rate, which a 50 % share of the
SMs does not slow: there the share may measure as fast as the whole GPU, but not faster (then the whole
GPU's figure is a fault of the measurement). Since rows are timed from a full queue on CUDA (host-free,
:func:`executor.profiler.timing.phase_times`) the device time is the GPU's everywhere, and the judgement
below, which asks for a slower share only where the whole GPU is device-bound, still holds. Where the whole
GPU is device-bound, half its SMs must show: the share is clearly slower.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

DEVICE_BOUND = 0.8  # host issue time (forward + backward) under this fraction of the time: device-bound
SLOWER = 1.2  # a 50 % share's device-bound layer at least this much slower than the whole GPU's
FASTER = 0.9  # nowhere may the share's layer take under this fraction of the whole GPU's


@dataclass(frozen=True)
class LayerTime:
    """Forward + backward of one layer: the device's seconds and the host's seconds to issue them."""

    seconds: float
    host_s: float

    @property
    def device_bound(self) -> bool:
        return self.host_s < DEVICE_BOUND * self.seconds


def layer_times(entry: dict[str, Any]) -> dict[int, LayerTime]:
    """The single-GPU layer (TP 1, no recompute, no live collectives) of a measured device entry, per
    micro-batch. A row without host times (calibrated before they were recorded) is a KeyError."""
    return {r["micro_batch"]: LayerTime(r["forward_s"] + r["backward_s"], r["forward_host_s"] + r["backward_host_s"])
            for r in entry["measured"]["layer"]
            if r["tp"] == 1 and r["recompute"] == "none" and not r.get("collectives")}


def share_faults(share: dict[int, LayerTime], whole: dict[int, LayerTime]) -> list[str]:
    """What contradicts ``share`` being a 50 % share of the GPU measured as ``whole``, one line each
    (empty: none): at a micro-batch where the whole GPU is device-bound the share must take over
    ``SLOWER`` x its time; anywhere, at least ``FASTER`` x; and some micro-batch must be device-bound, or
    nothing here could tell a share from the whole GPU."""
    if not share or share.keys() != whole.keys():
        return [f"the share's micro-batches {sorted(share)} are not the whole GPU's {sorted(whole)}"]
    out = []
    for mb in sorted(whole):
        s, w = share[mb].seconds, whole[mb]
        said = (f"micro-batch {mb}: share {s * 1e3:.2f} ms, whole GPU {w.seconds * 1e3:.2f} ms "
                f"(host {w.host_s * 1e3:.2f} ms")
        if w.device_bound and s <= SLOWER * w.seconds:
            out.append(f"{said}, device-bound): the share is not {SLOWER}x slower")
        elif s < FASTER * w.seconds:
            out.append(f"{said}): the share is over {1 - FASTER:.0%} faster than the whole GPU")
    if not any(w.device_bound for w in whole.values()):
        out.append(f"no micro-batch of {sorted(whole)} is device-bound on the whole GPU (host issue time under "
                   f"{DEVICE_BOUND}x the layer's): the calibration cannot show the share slower; time larger ones")
    return out
