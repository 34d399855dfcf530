"""Fan-out of a stage's shards over Dask: a local cluster (worker processes on this machine)
by default, or a running cluster given by its scheduler address (`--cluster tcp://host:8786`).

Why Dask (over Ray): the work is a bag of independent, idempotent shard jobs (each writes one
file atomically, named by a digest of its content plan), which is exactly Dask's futures
model; Dask's scheduler reruns a task whose worker died on another worker, a cluster is one
`dask scheduler` + `dask worker ADDRESS` per host (no object store, no GPU runtime), and
Prefect runs flows on the same cluster through `prefect-dask`.

Nothing is lost or counted twice: a job's result comes back once, from the run that
finished; a job whose worker was lost mid-shard is run again from the start and writes the
same file (a half-written temporary file is never renamed into place).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable


def client(address: str | None = None, workers: int | None = None):
    """A Dask client: to the scheduler at `address`, or (None or "local") to a new local cluster of `workers`
    single-threaded worker processes (default: all cores)."""
    from distributed import Client, LocalCluster

    if address and address != "local":
        return Client(address, timeout=30)
    n = workers or os.cpu_count() or 1
    cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True, dashboard_address=None,
                           silence_logs=40)
    return Client(cluster)


def check_address(value: str | None, key: str) -> None:
    """A params value naming where jobs run: None (in this process), "local" (a local
    cluster) or a scheduler's address."""
    from pipeline import params as P

    P.require(value is None or value == "local" or "://" in value,
              f"{key} must be null, 'local' or a scheduler address like tcp://host:8786, got {value!r}")


def run(fn: Callable, jobs: Iterable[tuple], address: str | None = None, workers: int | None = None,
        on_result: Callable | None = None, on_client: Callable | None = None) -> list:
    """fn(*job) for every job on the cluster; results in completion order. `on_client` sees
    the client once the jobs are submitted (tests use it to kill a worker mid-run)."""
    from distributed import as_completed

    jobs = list(jobs)
    if not jobs:
        return []
    c = client(address, workers)
    try:
        futures = [c.submit(fn, *job, pure=False, retries=2) for job in jobs]
        if on_client is not None:
            on_client(c)
        out = []
        for fut in as_completed(futures):
            r = fut.result()
            out.append(r)
            if on_result is not None:
                on_result(r)
        return out
    finally:
        cluster = c.cluster
        c.close()
        if cluster is not None and not address:
            cluster.close()
