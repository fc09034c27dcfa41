"""``benchmarks.executor.device_gaps``: idle time between device work in a Chrome trace, and the host
op running when each gap began."""

from __future__ import annotations

from benchmarks.executor.device_gaps import device_gaps, format_gaps


def _x(cat: str, name: str, ts: float, dur: float) -> dict[str, object]:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur}


def test_gaps_are_the_idle_stretches_between_merged_device_work() -> None:
    trace = {"traceEvents": [
        _x("kernel", "gemm", 0, 100), _x("kernel", "add", 50, 100),  # overlap: one busy span 0-150
        _x("gpu_memcpy", "copy", 150, 10),                               # touching: still busy to 160
        _x("kernel", "adam", 1160, 40),                                  # a 1000 us gap
        _x("kernel", "norm", 1210, 10),                                  # a 10 us gap (under min_us)
        _x("cpu_op", "aten::copy_", 100, 2000), _x("cpu_op", "cudaStreamSynchronize", 150, 500),
        _x("python_function", "step", 0, 5000)]}
    g = device_gaps(trace)
    assert g["window_ms"] == 1.22 and g["busy_ms"] == 0.21 and g["idle_ms"] == 1.01
    assert g["gaps"] == 1 and g["idle_in_gaps_ms"] == 1.0
    assert g["largest"] == [{"at_ms": 0.16, "ms": 1.0, "host_op": "cudaStreamSynchronize"}]
    assert "idle   1.000 ms" in format_gaps(g)


def test_no_device_work_reads_zero() -> None:
    g = device_gaps({"traceEvents": [_x("cpu_op", "aten::mm", 0, 10)]})
    assert g["busy_ms"] == 0.0 and g["largest"] == []
