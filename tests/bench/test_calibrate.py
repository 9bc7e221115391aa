"""The machine-speed calibration: a fixed workload, the same answer every time, and a figure per round."""

from bench.calibrate import calibrate, workload


def test_the_workload_is_fixed_work() -> None:
    assert workload(50) == workload(50)
    assert workload(50) != workload(51)


def test_calibrate_reports_the_best_round() -> None:
    result = calibrate(rounds=3, iterations=20)
    assert len(result["rounds_ms"]) == 3
    assert result["ms"] == min(result["rounds_ms"])
    assert result["iterations"] == 20
