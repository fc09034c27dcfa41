"""Executor throughput on GPUs: MFU against a Hugging Face baseline measured in the same run."""
