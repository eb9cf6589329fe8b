"""tools/scaling_report.py (cplm_megatron/experiments/scaling/report.py) on synthetic run records with
hand-computed expectations."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tools.scaling_report import (
    ReportError,
    cplm_overheads,
    load_records,
    main,
    scaling_series,
    write_report,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def write_summary(path: Path, preset: str, copy_head: bool, nodes: int, tokens_per_sec: float,
                  flops_per_token: float, tp: int = 1, pp: int = 1, tasks_per_node: int = 8) -> Path:
    """A record with the exact shape the trainer writes (trainer.Trainer._write_summary)."""
    world = nodes * tasks_per_node
    record = {
        "preset": preset, "copy_head": copy_head,
        "layout": {"tp": tp, "pp": pp, "dp": world // (tp * pp), "vpp": None, "sp": False, "world_size": world},
        "nodes": nodes, "device": "NVIDIA H100", "seq_len": 2048, "global_batch": 256, "iterations": 50,
        "tokens_per_sec": tokens_per_sec, "tflops_per_device": tokens_per_sec * flops_per_token / world / 1e12,
        "mfu": 0.4, "step_time": 256 * 2048 / tokens_per_sec, "peak_memory_gib": 30.5,
        "flops_per_token": flops_per_token, "config_hash": f"h{preset}{int(copy_head)}{nodes}",
    }
    path.mkdir(parents=True, exist_ok=True)
    (path / "summary.json").write_text(json.dumps(record))
    return path / "summary.json"


@pytest.fixture
def study(tmp_path: Path) -> Path:
    """small: CPLM at 1/2/4 nodes (two runs at 2 nodes) and a baseline at 1 node; large: CPLM at 1 node."""
    runs = tmp_path / "runs"
    write_summary(runs / "small-n1-cplm", "small", True, 1, 1000.0, 1.05e9)
    write_summary(runs / "small-n2-cplm-a", "small", True, 2, 1700.0, 1.05e9)
    write_summary(runs / "small-n2-cplm-b", "small", True, 2, 1900.0, 1.05e9)
    write_summary(runs / "small-n4-cplm", "small", True, 4, 3200.0, 1.05e9)
    write_summary(runs / "small-n1-base", "small", False, 1, 1100.0, 1.0e9)
    write_summary(runs / "large-n1-cplm", "large", True, 1, 200.0, 8.4e9)
    return runs


def test_scaling_efficiency_is_per_device_throughput_against_the_smallest_run(study: Path):
    series = scaling_series(load_records([study]))
    small = series[("small", True, "tp1pp1", 2048, 256)]
    assert [(p.nodes, p.world_size, p.runs) for p in small] == [(1, 8, 1), (2, 16, 2), (4, 32, 1)]
    # fp64 means and ratios of a few numbers: pytest.approx's default rel 1e-6 is far above their rounding
    assert [p.tokens_per_sec for p in small] == pytest.approx([1000.0, 1800.0, 3200.0])  # 2 nodes: mean
    # 1800 tok/s on 16 devices vs 1000 on 8: 112.5 / 125 per device
    assert [p.efficiency for p in small] == pytest.approx([1.0, 0.9, 0.8])
    assert [p.efficiency for p in series[("small", False, "tp1pp1", 2048, 256)]] == [1.0]


def test_cplm_overhead_pairs_equal_configurations_only(study: Path):
    overheads = cplm_overheads(load_records([study]))
    assert len(overheads) == 1  # small at 1 node; large has no baseline, small@2/4 nodes neither
    o = overheads[0]
    assert (o.preset, o.nodes, o.layout) == ("small", 1, "tp1pp1")
    # fp64 ratios, as above
    assert o.time_overhead == pytest.approx(1100.0 / 1000.0 - 1)
    assert o.flops_overhead == pytest.approx(0.05)


def test_report_has_tables_and_plots(study: Path, tmp_path: Path):
    out = tmp_path / "report"
    report = write_report([study], out).read_text()
    assert report.count("| small | on | 2 |") == 2 and "| large | on | 1 |" in report
    assert "90.0%" in report and "80.0%" in report  # efficiency at 2 and 4 nodes
    assert "+10.0%" in report and "+5.0%" in report  # time and FLOP overhead of the copy head
    for name in ("throughput_vs_nodes.png", "scaling_efficiency.png", "cplm_overhead.png"):
        assert f"]({name})" in report
        data = (out / name).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 5000


def test_report_without_pairs_says_so_and_skips_that_plot(tmp_path: Path):
    write_summary(tmp_path / "runs" / "a", "small", True, 1, 1000.0, 1e9)
    write_summary(tmp_path / "runs" / "b", "small", True, 2, 2000.0, 1e9)
    report = write_report([tmp_path / "runs"], tmp_path / "out").read_text()
    assert "No copy-head on/off pairs" in report
    assert not (tmp_path / "out" / "cplm_overhead.png").exists()
    assert (tmp_path / "out" / "throughput_vs_nodes.png").is_file()


def test_bad_records_name_the_file_and_the_problem(tmp_path: Path, capsys):
    with pytest.raises(ReportError, match=r"no run_record.json \(or summary.json\) under"):
        load_records([tmp_path])
    path = write_summary(tmp_path / "x", "small", True, 1, 1000.0, 1e9)
    data = json.loads(path.read_text())
    del data["tokens_per_sec"]
    path.write_text(json.dumps(data))
    with pytest.raises(ReportError, match=r"x/summary.json: missing key 'tokens_per_sec'"):
        load_records([tmp_path])
    (path.parent / "run_record.json").write_text(json.dumps({**data, "version": 9}))  # the current name wins
    with pytest.raises(ReportError, match=r"x/run_record.json is a run record of version 9; this cplm_megatron reads"):
        load_records([tmp_path])
    assert main([str(tmp_path / "missing"), "--output", str(tmp_path / "out")]) == 2
    assert "does not exist" in capsys.readouterr().err
