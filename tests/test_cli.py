"""The command line: bad input gets a one-line error and exit status 2."""

import yaml

from pipeline.cli import main


def _params(tmp_path, **search):
    values = {"target": {"kind": "llvm", "num-cores": 2}, "families": ["matmul"], "num_workloads": 1,
              "trials_per_workload": 2, "trials_per_iter": 2, "work_dir": str(tmp_path / "s"),
              "report": str(tmp_path / "s.json")}
    values.update(search)
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump({"search": values}))
    return str(path)


def test_invalid_target_exits_2_with_one_line(tmp_path, capsys):
    assert main(["--params", _params(tmp_path, target="no-such-target"), "search", "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "not valid" in err and "no-such-target" in err


def test_invalid_params_exit_2(tmp_path, capsys):
    assert main(["--params", _params(tmp_path, families=["nope"]), "search"]) == 2
    assert "unknown families" in capsys.readouterr().err


def test_missing_params_file_exit_2(tmp_path, capsys):
    assert main(["--params", str(tmp_path / "absent.yaml"), "search"]) == 2
    assert "not found" in capsys.readouterr().err


def test_an_evaluation_in_parts_without_an_archive_exits_2(capsys):
    assert main(["--params", "params.yaml", "evaluate", "--metaschedule-only", "--part", "0/2"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "evaluate.archive_dir" in err


def test_an_evaluation_archive_of_another_gpu_exits_2(tmp_path, monkeypatch, capsys):
    """The GPU profile's kept evaluation (H200 timings) on an H100: one line, exit 2, nothing timed."""
    import shutil

    from pipeline import archive

    profile = yaml.safe_load(open("profiles/gpu.yaml"))
    kept = tmp_path / "kept"
    kept.mkdir()
    shutil.copy("databases/evaluate-gpu/device.json", kept / "device.json")
    profile["evaluate"]["archive_dir"] = str(kept)
    path = tmp_path / "gpu.yaml"
    path.write_text(yaml.safe_dump(profile))
    monkeypatch.setattr(archive, "gpu_names", lambda: ["NVIDIA H100 80GB HBM3"])
    assert main(["--params", str(path), "evaluate", "--metaschedule-only", "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "NVIDIA H200" in err and "H100 80GB HBM3" in err
    assert sorted(p.name for p in kept.iterdir()) == ["device.json"]
