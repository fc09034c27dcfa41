"""A GPU benchmark's JSON records the NCCL settings its ranks ran under (issue 34 compares
``NCCL_CUMEM_ENABLE=0`` against the default in separate runs: each file must say which it was)."""

from benchmarks.executor.run_meta import nccl_settings


def test_nccl_settings_keeps_only_nccl_variables_sorted() -> None:
    env = {"NCCL_NVLS_ENABLE": "0", "PATH": "/bin", "NCCL_CUMEM_ENABLE": "0", "XNCCL_X": "1"}
    assert nccl_settings(env) == {"NCCL_CUMEM_ENABLE": "0", "NCCL_NVLS_ENABLE": "0"}
    assert list(nccl_settings(env)) == ["NCCL_CUMEM_ENABLE", "NCCL_NVLS_ENABLE"]


def test_no_nccl_variables_gives_an_empty_record() -> None:
    assert nccl_settings({"HOME": "/root"}) == {}
