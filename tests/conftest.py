import os

import pytest

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DVC_NO_ANALYTICS", "1")


@pytest.fixture(autouse=True)
def _metaschedule_logger_propagates_again():
    """TVM's `tune_tir` / `tune_relax` make the `tvm.s_tir.meta_schedule` logger non-propagating
    and, on their next call, build their logging config from the names of the handlers on it.
    pytest (9) attaches its unnamed capture handlers to every non-propagating logger at each
    test phase, so a second `tune_tir` in one test process (another test on the same xdist
    worker) failed in TVM's logging set-up ('NoneType' object has no attribute 'format'). After
    each test the logger propagates again, so pytest leaves it alone."""
    import logging

    yield
    logging.getLogger("tvm.s_tir.meta_schedule").propagate = True


@pytest.fixture(scope="session")
def cpu_target():
    from pipeline.tvm_env import make_target

    return make_target({"kind": "llvm", "num-cores": 2})


@pytest.fixture(scope="session")
def cuda_target():
    from pipeline.tvm_env import make_target

    return make_target("nvidia/nvidia-h100")


@pytest.fixture(scope="session")
def matmul_mod():
    from pipeline.workloads import Spec, build

    return build(Spec("matmul", (16, 256, 256), "float32"))
