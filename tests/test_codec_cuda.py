"""CUDA traces: exact round trips and real nvcc compilation (a file of its own so the test
runner can balance it against the CPU codec tests)."""

import pytest

from test_codec import _assert_round_trips, _builds_of_decoded, _sample_traces

from pipeline.workloads import FAMILIES


@pytest.mark.slow     # ~100 s of nvcc; `make test` runs it in its second phase
def test_cuda_traces_round_trip_exactly_and_compile_with_nvcc(cuda_target):
    """On a machine without a GPU tvm.compile keeps CUDA source uncompiled (GPU.md), so the
    source is compiled for real with nvcc for the H100/H200 architecture."""
    from pipeline.tvm_env import tvm

    # More workloads than on the CPU: VerifyGPUCode rejects a share of CUDA samples.
    traces = _sample_traces(cuda_target, sorted(FAMILIES), 7, 8)
    families = _assert_round_trips(traces, cuda_target)
    assert len(traces) >= 400 and len(families) >= 12
    built = _builds_of_decoded(traces, cuda_target, 6)
    assert len(built) >= 6
    for family, executable in built.items():
        source = executable.mod.imports[0].inspect_source()
        with cuda_target:
            cubin = tvm.support.nvcc.compile_cuda(source, target_format="cubin", compiler="nvcc")
        assert len(cubin) > 1000, family
