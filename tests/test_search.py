"""The search stage on a real (tiny) MetaSchedule run on the CPU."""

import json
import time
from pathlib import Path

import pytest

from pipeline import files
from pipeline.params import ParamsError, from_dict
from pipeline.stages.search import SearchParams, record_counts, run_search, select_workloads


def _params(tmp_path, **over):
    values = dict(target={"kind": "llvm", "num-cores": 2}, families=["matmul"], num_workloads=1,
                  trials_per_workload=4, trials_per_iter=4, max_mflop=2, max_elements=200000,
                  population_size=8, genetic_num_iters=1, shard_size=1, run_timeout_s=10, min_repeat_ms=5,
                  work_dir=str(tmp_path / "search"), report=str(tmp_path / "search.json"))
    values.update(over)
    return from_dict(SearchParams, values)


def test_search_records_every_candidate_and_resumes(tmp_path):
    p = _params(tmp_path)
    summary = run_search(p, progress=False)
    shard = tmp_path / "search" / "shard-0000"
    counts = record_counts(shard)
    assert summary["trials"] == sum(counts.values()) >= 4
    row = summary["per_workload"][0]
    assert row["best_s"] > 0 and row["baseline_s"] > 0 and row["speedup"] > 0
    assert json.loads((tmp_path / "search.json").read_text())["workloads"] == 1
    # Resume: the workload already holds its budget, so nothing new is measured.
    lines_before = (shard / "database_tuning_record.json").read_text().count("\n")
    run_search(p, progress=False)
    assert (shard / "database_tuning_record.json").read_text().count("\n") == lines_before


def test_failed_builds_are_data_not_crashes(tmp_path):
    p = _params(tmp_path, build_timeout_s=0.001)
    summary = run_search(p, progress=False)
    errors = list(files.read_jsonl(tmp_path / "search" / "shard-0000" / "errors.jsonl"))
    assert errors and all(e["stage"] == "build" for e in errors)
    assert errors[0]["trace"][0][0][0] == "GetSBlock"  # the failed candidate's trace is kept
    assert summary["failed_trials"] == summary["trials"] >= 1


def test_selection_respects_limits_and_families(tmp_path):
    p = _params(tmp_path, families=["matmul", "softmax", "pool2d"], num_workloads=6, max_mflop=5, max_elements=100000)
    chosen = select_workloads(p)
    assert len(chosen) == 6
    assert [s.family for s in chosen[:3]] == ["matmul", "softmax", "pool2d"]


def test_no_eligible_workload_is_a_clear_error(tmp_path):
    with pytest.raises(ParamsError, match="no workload"):
        run_search(_params(tmp_path, max_elements=10), progress=False)


@pytest.mark.parametrize("over,match", [
    ({"families": ["nope"]}, "unknown families"),
    ({"trials_per_iter": 99}, "trials_per_iter"),
    ({"num_workloads": 0}, "num_workloads"),
    ({"devices": [0, -1]}, "GPU indices"),
])
def test_bad_params_are_rejected_with_a_fix(tmp_path, over, match):
    with pytest.raises(ParamsError, match=match):
        _params(tmp_path, **over)


@pytest.mark.slow   # 60-120 s on 2 cores: in `make test`'s second phase, so the first stays under 15 min
def test_a_search_killed_mid_write_resumes_with_every_record_once(tmp_path):
    """A real SIGKILL of the search process while it appends records, and half a record left
    at the end of the database (what a kill inside a write leaves): TVM's JSONDatabase would
    refuse that file; the stage repairs it, resumes, and every complete record is kept once."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    import yaml

    root = Path(__file__).resolve().parent.parent
    p = _params(tmp_path, trials_per_workload=16, trials_per_iter=4)
    raw = yaml.safe_load((root / "params.yaml").read_text())
    raw["search"] = {k: getattr(p, k) for k in raw["search"]}
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(raw))
    db = tmp_path / "search" / "shard-0000" / "database_tuning_record.json"
    proc = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "--params", str(params), "search", "--quiet"],
                            cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(root)}, start_new_session=True)
    deadline = time.time() + 300
    while time.time() < deadline and (not db.exists() or db.read_text().count("\n") < 4):
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    complete = [ln for ln in db.read_text().splitlines(keepends=True) if ln.endswith("\n")]
    assert 4 <= len(complete) < 16
    with open(db, "w") as f:                  # the torn tail a kill inside write() leaves
        f.writelines(complete)
        f.write(complete[-1][: len(complete[-1]) // 2])
    summary = run_search(p, progress=False)
    lines = db.read_text().splitlines()
    assert all(ln.strip() for ln in lines) and len(lines) == len(set(lines)) == summary["trials"] >= 16
    assert lines[: len(complete)] == [ln.rstrip("\n") for ln in complete]   # nothing lost


def test_a_task_scheduler_exception_costs_only_its_workload(tmp_path, monkeypatch):
    """TVM's task scheduler raising inside a shard (seen on the H200) is recorded; the other
    workload of the shard is tuned alone, the bad one is listed and not retried on resume."""
    from pipeline.stages import search

    p = _params(tmp_path, num_workloads=2, shard_size=2)
    bad = select_workloads(p)[1].id
    real, calls = search._tune_shard, []

    def flaky(p_, target, shard_dir, pending, bar, pool=None, runner=None):
        calls.append([s.id for s, _, _ in pending])
        if bad in calls[-1]:
            time.sleep(0.2)
            raise IndexError("Index 3 out of bounds 3")
        return real(p_, target, shard_dir, pending, bar, pool, runner)

    monkeypatch.setattr(search, "_tune_shard", flaky)
    summary = run_search(p, progress=False)
    good = [r for r in summary["per_workload"] if r["id"] != bad][0]
    assert good["trials"] >= 4
    assert list(summary["failed_workloads"].values()) == ["IndexError: Index 3 out of bounds 3"]
    errors = list(files.read_jsonl(tmp_path / "search" / "shard-0000" / "errors.jsonl"))
    assert [e["stage"] for e in errors] == ["scheduler", "scheduler"]
    from pipeline.bench.search import scheduler_errors
    assert scheduler_errors(str(tmp_path / "search")) == 2          # what the throughput benchmark reports
    assert summary["this_run"]["parts"][0]["failed_run_s"] >= 0.4      # the failed runs' time, apart
    assert calls == [[good["id"], bad], [good["id"]], [bad]] or calls == [[bad, good["id"]], [good["id"]], [bad]]
    calls.clear()
    run_search(p, progress=False)
    assert calls == []                      # nothing left to tune; the failed workload is not retried


def test_a_workload_without_a_design_space_leaves_the_rest_of_its_shard_together(tmp_path, monkeypatch):
    """When a run raises, the workloads whose design space cannot be generated are listed as
    failed and the others are tuned together again (not one at a time)."""
    from pipeline.stages import search

    p = _params(tmp_path, num_workloads=3, shard_size=3)
    ids = [s.id for s in select_workloads(p)]
    bad, calls, checked = ids[1], [], []
    real = search._tune_shard

    def flaky(p_, target, shard_dir, pending, bar, pool=None, runner=None):
        calls.append(sorted(s.id for s, _, _ in pending))
        if bad in calls[-1]:
            raise IndexError("Index 6 out of bounds 6")
        return real(p_, target, shard_dir, pending, bar, pool, runner)

    def no_space(target, spec):
        checked.append(spec.id)
        return "IndexError: Index 6 out of bounds 6" if spec.id == bad else None

    monkeypatch.setattr(search, "_tune_shard", flaky)
    monkeypatch.setattr(search, "design_space_error", no_space)
    summary = run_search(p, progress=False)
    assert calls == [sorted(ids), sorted(set(ids) - {bad})]
    assert sorted(checked) == sorted(ids)
    assert summary["failed_workloads"] == {bad: "IndexError: Index 6 out of bounds 6"} or \
        list(summary["failed_workloads"].values()) == ["IndexError: Index 6 out of bounds 6"]
    assert all(r["trials"] >= 4 for r in summary["per_workload"] if r["id"] != bad)
    calls.clear()
    run_search(p, progress=False)
    assert calls == []


def test_design_space_error_names_the_cuda_kernel_tvm_cannot_sketch():
    """The real case behind the test above (the H200 benchmark's attention_score workload): its
    CUDA design space raises inside TVM's space generator; a softmax beside it does not."""
    import dataclasses

    from pipeline import params as P
    from pipeline.stages.search import design_space_error
    from pipeline.tvm_env import make_target

    p = dataclasses.replace(P.load("search", SearchParams, "profiles/gpu.yaml"), num_workloads=8)
    specs = {s.id: s for s in select_workloads(p)}
    target = make_target(p.target)
    assert design_space_error(target, specs["attention_score-a7a2933885"]).startswith("IndexError")
    assert design_space_error(target, specs["softmax-bbd132e1db"]) is None


def test_builder_workers_are_kept_across_rounds(tmp_path):
    """The persistent builder builds every round with the same worker processes (TVM's
    LocalBuilder starts new ones each round), and the stage logs its throughput."""
    from pipeline import tuning
    from pipeline.tvm_env import make_target, ms, tvm
    from pipeline.workloads import build

    p = _params(tmp_path)
    mod = build(select_workloads(p)[0])
    target = make_target(p.target)
    phases = tuning.Phases()
    builder = tuning.PoolBuilder(2, 30, phases)
    inputs = [ms.builder.BuilderInput(mod, target)]
    pids = []
    for _ in range(2):
        result = builder.build(inputs)[0]
        assert result.error_msg is None
        pids.append({w._proc.pid for w in builder._pool._worker_map.values()})
    builder.shutdown()
    # linked by the build worker (a shared library), not a tar for the runner's one worker to link
    artifact = Path(result.artifact_path)
    assert artifact.suffix == ".so" and artifact.read_bytes()[:4] == b"\x7fELF"
    assert tvm.runtime.load_module(str(artifact)) is not None
    assert pids[0] == pids[1] and phases.rounds == 2 and phases.candidates == 2
    summary = run_search(_params(tmp_path, trials_per_workload=8, trials_per_iter=4), progress=False)
    log = list(files.read_jsonl(tmp_path / "search" / "throughput.jsonl"))
    assert log[0]["rounds"] == 2 and log[0]["candidates"] == 8 and log[0]["build_s"] > 0
    # TVM's LocalRunner measures inside Runner.run: that time is the run's, not the strategy's
    assert log[0]["run_s"] > 0
    # the machine's busy cores over the shard: its builds and measurements kept at least part of one busy
    assert 0 < log[0]["cores_busy"] <= log[0]["host_cpus"] + 0.5
    # the shard's DLight baselines (built and timed after its tuning) are timed apart
    assert log[0]["baseline_s"] > 0 and json.loads((tmp_path / "search" / "shard-0000" / "baselines.json").read_text())
    assert summary["this_run"]["measured"] == 8 and summary["this_run"]["candidates_per_min"] > 0
    assert 0 < summary["this_run"]["cores_busy"] <= summary["this_run"]["host_cpus"] + 0.5


# the second case (a runner a shard without the persistent builder) is slow-marked: 50 s, default run under 15 min
@pytest.mark.parametrize("persistent,made", [(True, 1), pytest.param(False, 2, marks=pytest.mark.slow)])
def test_one_runner_measures_every_shard(tmp_path, monkeypatch, persistent, made):
    """TVM's LocalRunner starts its measuring worker (a process importing TVM, 5-7 s here) when
    it is made; made for each shard, that time went between the shards, outside every timer (8-12 s
    a shard of session 33's H100 campaign step). The stage now makes one for all its shards."""
    from pipeline import tuning

    runners = []
    real = tuning.make_runner

    def counted(sp):
        runners.append(real(sp))
        return runners[-1]

    monkeypatch.setattr(tuning, "make_runner", counted)
    summary = run_search(_params(tmp_path, num_workloads=2, persistent_builder=persistent), progress=False)
    assert len(runners) == made and summary["this_run"]["measured"] == 8
    assert all(sum(record_counts(tmp_path / "search" / f"shard-000{i}").values()) == 4 for i in range(2))


@pytest.mark.slow   # 60-120 s on 2 cores: in `make test`'s second phase, so the first stays under 15 min
@pytest.mark.parametrize("devices,labels", [([0, 1], {"gpu0", "gpu1"}), ([0, 0], {"gpu0.0", "gpu0.1"})])
def test_two_devices_tune_alternate_shards_in_two_processes(tmp_path, devices, labels):
    """One process per GPU, or two sharing GPU 0 (taking turns to measure behind one lock file):
    every candidate measured once."""
    p = _params(tmp_path, num_workloads=2, shard_size=1, devices=devices, builder_workers=2)
    summary = run_search(p, progress=False)
    assert [r["trials"] for r in summary["per_workload"]] == [4, 4]
    parts = summary["this_run"]["parts"]
    assert [x["device"] for x in parts] == devices and all(x["candidates"] == 4 for x in parts)
    assert {e["part"] for e in files.read_jsonl(tmp_path / "search" / "throughput.jsonl")} == labels
    assert all(x["cpus"] >= 1 and x["lock_wait_s"] >= 0 for x in parts)
    assert (tmp_path / "search" / ".device-0.lock").exists() == (devices == [0, 0])


# slow phase (38-65 s on CI's 2 cores): the default run stays under 15 min
@pytest.mark.slow
def test_a_workload_whose_search_ends_short_is_not_retried(tmp_path, monkeypatch):
    """MetaSchedule ends a task when it cannot sample new candidates (seen on the H200: 'Cannot
    sample enough initial population'); such a workload is listed with its count and a resume
    does not spend a round on it again."""
    from pipeline.stages import search

    p = _params(tmp_path)
    real, calls = search._tune_shard, []

    def gives_up_early(p_, target, shard_dir, pending, bar, pool=None, runner=None):
        calls.append(len(pending))
        return real(p_, target, shard_dir, [(s, h, 2) for s, h, _ in pending], bar, pool, runner)

    monkeypatch.setattr(search, "_tune_shard", gives_up_early)
    first = run_search(p, progress=False)
    assert calls == [1] and 2 <= first["trials"] < 4
    assert list(first["exhausted_workloads"].values()) == [first["trials"]]
    again = run_search(p, progress=False)
    assert calls == [1] and again["this_run"]["measured"] == 0 and again["this_run"]["remaining_trials"] == 0


def test_each_gpu_process_gets_its_own_share_of_the_cores():
    from pipeline.stages.search import part_cpus

    cpus = list(range(32))
    shares = [part_cpus(cpus, k, 2) for k in range(2)]
    assert shares == [list(range(16)), list(range(16, 32))]
    assert part_cpus([0, 1, 2], 2, 3) == [2] and part_cpus([5], 1, 2) == [5]  # never empty


@pytest.mark.parametrize("pin", [True, False])
def test_a_gpu_process_is_pinned_to_its_share_or_shares_all_cores(tmp_path, monkeypatch, pin):
    import os

    from pipeline.stages import search

    seen = {}
    monkeypatch.setattr(os, "environ", dict(os.environ))        # the part sets CUDA_VISIBLE_DEVICES
    monkeypatch.setattr(search, "_run_shards", lambda p, *a, **k: seen.update(
        cpus=sorted(os.sched_getaffinity(0)), workers=p.builder_workers) or search.Phases())
    everything = sorted(os.sched_getaffinity(0))
    p = SearchParams(target={"kind": "llvm"}, families=["matmul"], num_workloads=1, trials_per_workload=64,
                     devices=[0, 0], builder_workers=14, pin_parts=pin, work_dir=str(tmp_path))
    try:
        search._run_part(p, [], 1, 2, 0, False, None)
    finally:
        os.sched_setaffinity(0, everything)
    assert seen == {"cpus": search.part_cpus(everything, 1, 2) if pin else everything, "workers": 7}


def test_a_fresh_clone_resumes_from_the_archived_databases(tmp_path):
    """The search archives each shard (compressed, kept in git); with the work folder gone
    (a fresh clone), the stage restores it and measures nothing twice. The archive only ever
    unpacks the shard's own file names."""
    import io
    import shutil
    import tarfile

    p = _params(tmp_path, archive_dir=str(tmp_path / "databases"))
    first = run_search(p, progress=False)
    tar = tmp_path / "databases" / "shard-0000.tar.xz"
    index = json.loads((tmp_path / "databases" / "index.json").read_text())
    assert tar.exists() and index["shard-0000"]["records"] == first["trials"] >= 4
    run = list(files.read_jsonl(tmp_path / "databases" / "runs.jsonl"))
    assert len(run) == 1 and run[0]["measured"] == first["trials"] and run[0]["machine"]["tvm"]
    before = tar.read_bytes()
    shutil.rmtree(tmp_path / "search")
    again = run_search(p, progress=False)
    assert again["trials"] == first["trials"] and again["this_run"]["measured"] == 0
    assert tar.read_bytes() == before                       # nothing changed, nothing rewritten
    assert len(list(files.read_jsonl(tmp_path / "databases" / "runs.jsonl"))) == 1
    # a hostile archive: a member outside the shard is never written
    with tarfile.open(tar, "w:xz") as t:
        data = b"x"
        for name in ("../escape.txt", "database_workload.json"):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    shutil.rmtree(tmp_path / "search")
    from pipeline import archive

    (tmp_path / "search" / "shard-0000").mkdir(parents=True)
    assert archive.restore(tmp_path / "search" / "shard-0000", tmp_path / "databases")
    assert not (tmp_path / "search" / "escape.txt").exists()


def test_stop_after_starts_no_new_shard_and_says_what_is_left(tmp_path):
    p = _params(tmp_path, num_workloads=2, shard_size=1)
    summary = run_search(p, progress=False, stop_after=1e-6)
    assert summary["this_run"]["measured"] == 0 and summary["this_run"]["remaining_trials"] == 8


def test_replay_first_round_then_evolutionary_search(tmp_path):
    """first_round: replay samples a task's first batch from the design space, then the
    evolutionary search takes over: the budget is measured in full, the same way."""
    from pipeline import tuning

    p = _params(tmp_path, trials_per_workload=8, trials_per_iter=4, first_round="replay")
    assert isinstance(tuning.strategy(p), tuning.ReplayFirst)
    summary = run_search(p, progress=False)
    assert summary["trials"] == 8 and summary["failed_trials"] == 0
    log = list(files.read_jsonl(tmp_path / "search" / "throughput.jsonl"))
    assert log[0]["first_round"] == "replay" and log[0]["rounds"] == 2


# both in the slow phase (the same search, 80-100 s each), so the default stays under 15 min
@pytest.mark.parametrize("server", [pytest.param("tvm.exec.rpc_server", marks=pytest.mark.slow),
                                    pytest.param("pipeline.rpc_server", marks=pytest.mark.slow)])
def test_search_measures_through_tvm_rpc_tracker_and_server(tmp_path, server):
    """runner: rpc - TVM's own tracker and one CPU RPC server on 127.0.0.1 measure the
    candidates (loopback; on a cluster the servers run on the GPU hosts): TVM's server, and
    pipeline.rpc_server (TVM's server whose session processes are spawned ahead, for GPUs)."""
    import os
    import signal
    import socket
    import subprocess
    import sys
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ}
    tracker = subprocess.Popen([sys.executable, "-m", "tvm.exec.rpc_tracker", "--host", "127.0.0.1", "--port", str(port),
                                "--port-end", str(port + 1)], env=env, stdout=open(tmp_path / "tracker.log", "w"),
                               stderr=subprocess.STDOUT, start_new_session=True)
    server_log = tmp_path / "server.log"
    proc = None
    try:
        time.sleep(2)
        proc = subprocess.Popen([sys.executable, "-m", server, "--tracker", f"127.0.0.1:{port}",
                                   "--key", "test-cpu", "--host", "127.0.0.1"], env=env,
                                  stdout=open(server_log, "w"), stderr=subprocess.STDOUT, start_new_session=True)
        from tvm import rpc

        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                summary = rpc.connect_tracker("127.0.0.1", port).summary()
                if any(q.get("key") == "test-cpu" for q in summary.get("server_info", [])):
                    break
            except Exception:   # noqa: BLE001 - the tracker is still starting
                pass
            time.sleep(0.5)
        p = _params(tmp_path, runner="rpc", rpc_tracker=f"127.0.0.1:{port}", rpc_key="test-cpu")
        summary = run_search(p, progress=False)
        assert summary["trials"] == 4 and summary["failed_trials"] == 0
        assert all(r["best_s"] > 0 for r in summary["per_workload"])
    finally:
        for child in (proc, tracker):   # the whole group: TVM's servers listen in a child process
            if child is not None:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()


@pytest.mark.slow     # ~95 s; the default phase keeps the cluster's stop-after test
def test_search_on_a_dask_cluster_survives_a_lost_worker(tmp_path):
    """The search's shards on a local Dask cluster of 2 workers; one worker is killed (SIGKILL)
    once the first candidates are in a database. Its shard runs again on the other worker and
    resumes the database: every workload ends with its budget, no record twice."""
    from pipeline.stages import search

    p = _params(tmp_path, num_workloads=2, shard_size=1, trials_per_workload=8, trials_per_iter=4,
                cluster="local", cluster_workers=2, builder_workers=1)
    plan = search._plan(p, select_workloads(p))
    killed = []

    dbs = [d / "database_tuning_record.json" for d, _, _ in plan]

    def kill_one(client):
        from helpers import kill_a_busy_worker

        killed.append(kill_a_busy_worker(client, lambda: any(db.exists() and db.read_text().count("\n") >= 1
                                                             for db in dbs)))

    parts = search.run_on_cluster(p, plan, progress=False, on_client=kill_one)
    assert killed and sorted(r["shard"] for r in parts) == ["shard-0000", "shard-0001"]
    for shard_dir, _, _ in plan:
        lines = (shard_dir / "database_tuning_record.json").read_text().splitlines()
        assert len(lines) == len(set(lines)) == 8, shard_dir
    summary = run_search(p, progress=False)             # nothing left to measure
    assert summary["this_run"]["measured"] == 0 and summary["trials"] == 16


def test_a_cluster_search_past_its_stop_after_leaves_its_shards(tmp_path):
    """--stop-after on a Dask cluster: a job that starts past the deadline measures nothing and
    says so; the shards stay for the next run."""
    from pipeline.stages import search

    p = _params(tmp_path, num_workloads=2, shard_size=1, trials_per_workload=8, trials_per_iter=4,
                cluster="local", cluster_workers=2, builder_workers=1)
    summary = run_search(p, progress=False, stop_after=1e-6)
    parts = summary["this_run"]["parts"]
    assert sorted(r["shard"] for r in parts) == ["shard-0000", "shard-0001"]
    assert all(r["skipped"] == "past --stop-after" for r in parts)
    assert summary["this_run"]["measured"] == 0 and summary["this_run"]["remaining_trials"] == 16



def test_bench_search_says_how_much_of_a_run_was_outside_its_parts():
    from pipeline.bench.search import outside_parts

    row = {"seconds": 102.9, "parts": [{"seconds": 71.4, "failed_run_s": 0.0, "baseline_s": 12.9},
                                       {"seconds": 56.3, "failed_run_s": 13.7, "baseline_s": 4.1}]}
    assert outside_parts(row) == 18.6
    assert outside_parts({"seconds": 10.0, "parts": []}) is None


def test_bench_search_compares_what_each_variant_found_with_the_first():
    from pipeline.bench.search import best_ratio

    first = {"a": 1.0, "b": 2.0, "c": None}
    assert best_ratio({"a": 0.5, "b": 2.0, "c": 1.0}, first) == round(0.5 ** 0.5, 4)
    assert best_ratio({"a": 2.0, "b": 4.0}, first) == 2.0
    assert best_ratio({"c": 1.0}, first) is None


def test_init_min_unmeasured_reaches_metaschedules_strategy(tmp_path):
    import dataclasses

    from pipeline.stages.search import SearchParams
    from pipeline.tuning import ReplayFirst, strategy

    p = dataclasses.replace(_params(tmp_path), population_size=64, trials_per_iter=8, trials_per_workload=16,
                            init_min_unmeasured=12, max_fail_count=20, first_round="replay")
    s = strategy(p)
    assert isinstance(s, ReplayFirst) and s.evolve.init_min_unmeasured == 12 and s.evolve.max_fail_count == 20
    clone = s._inst.clone().evolve     # what MetaSchedule clones per task
    assert clone.init_min_unmeasured == 12 and clone.max_fail_count == 20
    evo = strategy(dataclasses.replace(p, first_round="evolutionary"))
    assert evo.init_min_unmeasured == 12 and evo.max_fail_count == 20
    assert SearchParams.__dataclass_fields__["init_min_unmeasured"].default == 50   # MetaSchedule's own
    with pytest.raises(ValueError, match="init_min_unmeasured"):
        dataclasses.replace(p, init_min_unmeasured=0)
    # the evaluation's kept MetaSchedule runs (hours of GPU) stay valid under the default, and only then
    import tvm

    from pipeline import metaschedule

    target = tvm.target.Target("llvm")
    assert "init_min_unmeasured" not in metaschedule.settings(target, 4, dataclasses.replace(p, init_min_unmeasured=50))
    assert metaschedule.settings(target, 4, p)["init_min_unmeasured"] == 12
    assert "max_fail_count" not in metaschedule.settings(target, 4, dataclasses.replace(p, max_fail_count=5))
    assert metaschedule.settings(target, 4, p)["max_fail_count"] == 20
    with pytest.raises(ValueError, match="max_fail_count"):
        dataclasses.replace(p, max_fail_count=0)


def test_an_interrupted_run_keeps_its_shard_in_flight_and_logs_itself(tmp_path, monkeypatch):
    """Ctrl-C or `timeout -s INT` (session 34's GPU step ended so, its report and run line lost):
    the shard in flight is archived with what it measured, the report and the archive's run line
    are written (marked interrupted), the interrupt goes on, and the next run resumes the shard."""
    from pipeline.stages import search

    p = _params(tmp_path, num_workloads=2, archive_dir=str(tmp_path / "databases"))
    real, calls = search._tune_shard, []

    def interrupted(p_, target, shard_dir, pending, bar, pool=None, runner=None):
        calls.append(shard_dir.name)
        if shard_dir.name == "shard-0001" and len(calls) == 2:     # two trials measured, then Ctrl-C
            real(p_, target, shard_dir, [(s, h, 2) for s, h, _ in pending], bar, pool, runner)
            raise KeyboardInterrupt
        return real(p_, target, shard_dir, pending, bar, pool, runner)

    monkeypatch.setattr(search, "_tune_shard", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_search(p, progress=False)
    index = json.loads((tmp_path / "databases" / "index.json").read_text())
    assert index["shard-0000"]["records"] == 4 and 2 <= index["shard-0001"]["records"] < 4
    report = json.loads((tmp_path / "search.json").read_text())
    assert report["this_run"]["interrupted"] is True and report["this_run"]["measured"] == 4 + index["shard-0001"]["records"]
    runs = list(files.read_jsonl(tmp_path / "databases" / "runs.jsonl"))
    assert len(runs) == 1 and runs[0]["interrupted"] is True
    # a fresh work folder (a new machine) resumes from the archive: only shard-0001's rest is measured
    p2 = _params(tmp_path, num_workloads=2, archive_dir=str(tmp_path / "databases"), work_dir=str(tmp_path / "again"))
    again = run_search(p2, progress=False)
    assert again["this_run"]["measured"] == 4 - index["shard-0001"]["records"] and "interrupted" not in again["this_run"]
    assert calls[2:] == ["shard-0001"]
