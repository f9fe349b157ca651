"""bench/validate_predictions.py, the validation table's script: its errors and means, its
table, a row run end to end on simulated GPUs, and the gate that sees a moved prediction."""

import dataclasses
import importlib.util
import json
import pathlib
import subprocess
import sys

import pytest

from sgpu_cli import needs_cli

ROOT = pathlib.Path(__file__).resolve().parents[2]


def script():
    spec = importlib.util.spec_from_file_location(
        "validate_predictions", ROOT / "bench" / "validate_predictions.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["validate_predictions"] = module  # its dataclasses look themselves up
    spec.loader.exec_module(module)
    return module


def test_the_error_is_signed_and_the_mean_is_of_its_size():
    v = script()
    assert v.error(110, 100) == pytest.approx(0.10)
    assert v.error(90, 100) == pytest.approx(-0.10)
    assert v.mean_absolute([0.10, -0.30]) == pytest.approx(0.20)
    assert v.mean_absolute([]) is None


def test_the_table_keeps_calibrated_rows_apart_and_says_what_is_not_modelled():
    v = script()
    rows = [v.Row("a", "src A", "config A", 1000, 80.0, "8xH100", (), calibrated=True),
            v.Row("b", "src B", "config B", 2000, None, "8xH100", ()),
            v.Row("c", "src C", "config C", 4000, None, "8xH100", ()),
            v.Row("d", "src D", "config D", 500, 70.0, not_modelled="torch.compile")]
    predictions = {"a": v.Prediction(1.0, 1100, 84.0, "h100-nvswitch", 1),
                   "b": v.Prediction(1.0, 1800, 30.0, "h100-nvswitch", 1),
                   "c": v.Prediction(1.0, 5200, 30.0, "h100-nvswitch", 1)}
    table = v.markdown(rows, predictions)
    lines = table.splitlines()
    assert lines[2] == ("| a (src A) | config A | 1,000 | 1,100 (1.000 s on h100-nvswitch) | "
                        "+10.0% | 80.0 | 84.0 | +5.0% | yes |")
    assert lines[3].endswith("| -10.0% |  | 30.0 |  | no |")
    assert lines[5] == "| d (src D) | config D | 500 | not modelled: torch.compile | | 70.0 | | | |"
    # b at -10% and c at +30%: 20% on the rows not used for calibration; a apart.
    assert "Mean absolute error of tokens/s/GPU on the 2 rows not used for calibration: 20.0%." \
        in table
    assert "Mean absolute error of tokens/s/GPU on the 1 rows calibrated on: 10.0%." in table


def test_every_published_row_is_predicted_or_says_why_not():
    v = script()
    assert len({r.id for r in v.ROWS}) == len(v.ROWS)
    for row in v.ROWS:
        assert bool(row.not_modelled) != bool(row.node), row.id
        assert row.source and row.configuration and row.tokens_per_s > 0
    predicted = [r for r in v.ROWS if not r.not_modelled]
    assert len(predicted) >= 5
    assert any("torch.compile" in r.not_modelled for r in v.ROWS)
    assert any("float8" in r.not_modelled for r in v.ROWS)


@needs_cli
def test_a_row_runs_on_simulated_gpus_and_the_gate_sees_a_moved_prediction(tmp_path):
    v = script()
    row = v.Row("tiny", "here", "MPT debug size, 2 GPUs", 1000, None, "2xH100",
                ("--size", "mpt-debug", "--batch", "2", "--seq", "64", "--accum", "2",
                 "--loss", "fused"))
    p = v.predict(row, timeout=300)
    assert p.platform == "h100-nvswitch"
    # Two micro-batches of 2 x 64 tokens in the predicted step.
    assert p.tokens_per_s == pytest.approx(256 / p.step_seconds, rel=1e-2)
    assert 0 < p.step_seconds < 0.1 and p.reserved_gib >= 0
    baseline = tmp_path / "baseline.json"
    baseline.write_text(json.dumps({"context": {}, "benchmarks": v.benchmark_rows([row], {
        "tiny": p})}))
    moved = tmp_path / "moved.json"
    slower = v.Prediction(p.step_seconds * 1.05, p.tokens_per_s / 1.05, p.reserved_gib,
                          p.platform, p.wall_seconds)
    moved.write_text(json.dumps({"context": {}, "benchmarks": v.benchmark_rows([row], {
        "tiny": slower})}))
    compare = [str(ROOT / "ci" / "bench-compare"), "--counters-only"]
    same = subprocess.run([*compare, str(baseline), str(baseline)], capture_output=True, text=True)
    assert same.returncode == 0, same.stdout + same.stderr
    changed = subprocess.run([*compare, str(baseline), str(moved)], capture_output=True, text=True)
    assert changed.returncode == 1, changed.stdout + changed.stderr
    assert "model_step_ms" in changed.stdout + changed.stderr


@needs_cli
def test_a_row_of_several_nodes_runs_folded_and_its_ranks_shard_over_every_node():
    v = script()
    one = v.Row("one", "here", "MPT debug size, 2 GPUs", 1000, None, "2xH100",
                ("--size", "mpt-debug", "--batch", "2", "--seq", "64", "--loss", "fused"))
    two = dataclasses.replace(one, id="two", nodes=2)
    alone, folded = v.predict(one, timeout=300), v.predict(two, timeout=300)
    # One micro-batch of 2 x 64 tokens a GPU, on 2 GPUs or on 4 across 2 nodes: the same
    # compute a GPU; the folded world's shards are half as large and cross the network.
    assert folded.tokens_per_s == pytest.approx(128 / folded.step_seconds, rel=1e-2)
    assert folded.step_seconds != alone.step_seconds
    assert folded.reserved_gib <= alone.reserved_gib


@needs_cli
def test_the_worlds_benchmark_steps_a_2d_world_folded_against_its_floor():
    # bench/bench_worlds.py on a world small enough for a test: the debug size in 2D
    # parallelism (tensor parallel in each node of 2) on 2 nodes, folded into 3 processes.
    sys.path.insert(0, str(ROOT / "bench"))
    script()
    import bench_worlds

    world = bench_worlds.World("debug-2d", 2, ("--size", "debug", "--seq", "64", "--tp", "2"),
                               node="2xH100")
    row = bench_worlds.measure(world, timeout=300)
    assert (row["gpus"], row["processes"]) == (4, 3)
    assert row["x_floor"] == pytest.approx(row["wall_s"] / row["floor_s"])
    assert 0 < row["max_rss_bytes"] < 4 * 2**30
    assert row["model_step_ms"] > 0  # (its memory, under 0.01 GiB, prints as 0.00)
    # torchtitan's tokens per GPU: the 64 tokens of a tensor-parallel pair, shared by two.
    assert row["model_tokens_per_s"] == pytest.approx(32 / (row["model_step_ms"] / 1e3),
                                                      rel=1e-2)
