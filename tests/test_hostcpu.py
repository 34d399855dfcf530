import os

from pipeline import hostcpu


def _stat(tmp_path, user, system, idle, iowait):
    path = tmp_path / "stat"
    path.write_text(f"cpu  {user} 0 {system} {idle} {iowait} 0 0 0 0 0\ncpu0 1 2 3 4\n")
    return path


def test_busy_cores_are_busy_ticks_over_the_time_between_samples(tmp_path, monkeypatch):
    hz = os.sysconf("SC_CLK_TCK")
    monkeypatch.setattr(hostcpu, "STAT", _stat(tmp_path, 1000, 500, 9000, 100))
    clock = iter([10.0, 12.0])
    monkeypatch.setattr(hostcpu, "_clock", lambda: next(clock))
    start = hostcpu.sample()
    # 2 s later: 3 cores' worth of user + system ticks, idle and iowait grew too (not busy)
    monkeypatch.setattr(hostcpu, "STAT", _stat(tmp_path, 1000 + 4 * hz, 500 + 2 * hz, 9000 + 2 * hz, 100 + hz))
    assert hostcpu.cores_busy(start) == 3.0


def test_no_proc_stat_means_no_figure(tmp_path, monkeypatch):
    monkeypatch.setattr(hostcpu, "STAT", tmp_path / "absent")
    assert hostcpu.cores_busy(hostcpu.sample()) is None


def test_the_real_machine_reports_a_figure_within_its_cores():
    start = hostcpu.sample()
    sum(i * i for i in range(3_000_000))      # keep one core busy for a moment (~0.2 s)
    busy = hostcpu.cores_busy(start)
    assert busy is not None and 0 < busy <= os.cpu_count() + 0.5
