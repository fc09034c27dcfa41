"""Colours shared by the pictures: one hue per pipeline, a shade per stage, one colour per kind
of span."""

from __future__ import annotations

PIPELINE_HUES = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                 "#bcbd22", "#17becf")
STAGE_LIGHTEN = (0.0, 0.45, 0.2, 0.6)  # neighbouring stages of a pipeline differ in shade
SPAN_COLOURS = {"forward": "#4c72b0", "backward": "#55a868", "p2p": "#8172b2", "grad_sync": "#c44e52",
                "optimizer": "#937860"}
SPAN_LABELS = {"forward": "forward", "backward": "backward", "p2p": "p2p send/recv", "grad_sync": "grad sync",
               "optimizer": "optimizer"}
IDLE = "#ececec"
UNUSED = "#d9d9d9"


def _mix(hex_colour: str, white: float) -> str:
    rgb = [int(hex_colour[i:i + 2], 16) for i in (1, 3, 5)]
    return "#" + "".join(f"{round(c + (255 - c) * white):02x}" for c in rgb)


def stage_colour(pipeline: int, stage: int) -> str:
    return _mix(PIPELINE_HUES[pipeline % len(PIPELINE_HUES)], STAGE_LIGHTEN[stage % len(STAGE_LIGHTEN)])


def pipeline_colour(pipeline: int) -> str:
    return PIPELINE_HUES[pipeline % len(PIPELINE_HUES)]
