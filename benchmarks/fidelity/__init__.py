"""Cost-model fidelity on GPUs: measured step time and memory of plans beside the estimate, and
heterogeneous efficiency."""
