import os

import pytest

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DVC_NO_ANALYTICS", "1")


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
