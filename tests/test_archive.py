"""The databases kept in git (pipeline.archive): what a lost index entry must not cost."""

import json

from pipeline import archive


def _shard(path, records: int):
    path.mkdir(parents=True, exist_ok=True)
    (path / "database_workload.json").write_text('["0xabc", {}]\n')
    (path / "database_tuning_record.json").write_text(
        "".join(json.dumps([0, [[[], []], [1e-5 * (i + 1)], {}, []]]) + "\n" for i in range(records)))


def test_an_archive_the_index_lost_is_still_restored_and_not_rewritten(tmp_path):
    """index.json was found missing 21 of 36 kept runs; a step trusting it tuned kept tasks
    again. The archive itself is read when the index does not list it."""
    kept, work = tmp_path / "kept", tmp_path / "work" / "t1"
    _shard(work, 3)
    archive.save(work, kept)
    tar = kept / "t1.tar.xz"
    assert json.loads((kept / "index.json").read_text())["t1"]["records"] == 3
    (kept / "index.json").write_text("{}")                       # the entry is lost
    before = tar.stat().st_mtime_ns
    archive.save(work, kept)                                     # unchanged files: not archived again
    assert tar.stat().st_mtime_ns == before
    fresh = tmp_path / "fresh" / "t1"
    fresh.mkdir(parents=True)
    assert archive.restore(fresh, kept)                          # a fresh machine gets the 3 records
    assert (fresh / "database_tuning_record.json").read_text() == (work / "database_tuning_record.json").read_text()
    assert not archive.restore(fresh, kept)                      # nothing more to restore
    _shard(work, 5)
    archive.save(work, kept)                                     # changed: archived, the index whole again
    assert json.loads((kept / "index.json").read_text())["t1"]["records"] == 5


def test_gpu_timings_of_one_kind_only(tmp_path):
    """An evaluation archive of H200 timings met an H100 session: its MetaSchedule baselines
    would have been compared with the models' H100 timings. The first GPU step names its GPU;
    another kind is refused before anything is timed, the same kind goes on, no GPU is no check."""
    import pytest

    kept = tmp_path / "kept"
    assert archive.check_device(kept, names=[]) is None and not (kept / "device.json").exists()
    assert archive.check_device(kept, names=["NVIDIA H200"]) == "NVIDIA H200"
    assert json.loads((kept / "device.json").read_text()) == {"gpu": "NVIDIA H200"}
    assert archive.check_device(kept, names=["NVIDIA H200", "NVIDIA H200"]) == "NVIDIA H200"
    with pytest.raises(archive.DeviceMismatch, match="H200.*H100 80GB HBM3"):
        archive.check_device(kept, names=["NVIDIA H100 80GB HBM3"])
    assert json.loads((kept / "device.json").read_text()) == {"gpu": "NVIDIA H200"}


def test_the_kept_gpu_evaluation_names_its_gpu():
    """The committed evaluation archive's timings are the H200's (sessions 16-31)."""
    from pathlib import Path

    assert json.loads(Path("databases/evaluate-gpu/device.json").read_text()) == {"gpu": "NVIDIA H200"}
