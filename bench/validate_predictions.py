"""sgpu's predictions against published measurements: the validation table.

Each row is a training run someone measured on real GPUs and published (the source named),
run again here as the same model and configuration on simulated GPUs in shape-only compute
(examples/models/llama_step.py under `sgpu run --backend sim`; a row of several nodes as a
folded world, node 0's ranks standing for every node's: `--sim-fold`), so that the step time and
tokens per second per GPU the compute and collective models predict, and the peak reserved
memory the allocator model gives, stand beside what was measured, with the error of each.

    PYTHONPATH=build/python /opt/sgpu/venv/bin/python bench/validate_predictions.py \\
        [--rows ID,...] [--markdown table.md] [--json predictions.json]

It compares against the published figures in ROWS, nothing measured here. A row says
whether its figures were used to set the model's tables (calibrated) or not; the mean
absolute error is given for each kind apart, and only the second says how far a new
configuration can be trusted. Rows the models do not cover (torch.compile, float8) are
listed as not modelled rather than predicted as something else.

`--json FILE` writes each predicted row as a Google Benchmark row for `ci/bench-compare
--counters-only` (the predicted step, `model_step_ms`, and tokens per second,
`model_tokens_per_s`, held to --predicted-tolerance; the peak reserved memory,
`memory_reserved_bytes`, exact), so that a change to a model that moves a prediction is
seen: `ci/bench-compare --counters-only bench/predictions.json new.json`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import re
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
STEP = ROOT / "examples" / "models" / "llama_step.py"

TORCHTITAN = "pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md"
LLM_FOUNDRY = "mosaicml/llm-foundry scripts/train/benchmarking/README.md, H100 80GB BF16"
LLM_FOUNDRY_A100 = "mosaicml/llm-foundry scripts/train/benchmarking/README.md, A100 80GB"
# Its MPT trains in bfloat16 with FSDP's DEFAULT mixed precision (parameters gathered in
# bfloat16, gradients reduced in float32), as llama_step.py's bf16, and with a fused
# cross-entropy loss (no float32 copy of the logits): --loss fused.


@dataclasses.dataclass(frozen=True)
class Row:
    id: str
    source: str
    configuration: str
    tokens_per_s: float          # measured, per GPU
    memory_gib: float | None     # measured peak reserved memory, where published
    node: str = ""               # the simulated node (SGPU_SIM), "" where not modelled
    args: tuple = ()             # llama_step.py's arguments
    calibrated: bool = False     # its figures set the model's tables
    not_modelled: str = ""       # why it is not predicted
    nodes: int = 1               # nodes of `node`; several run folded (--sim-fold)


def mpt_row(source: str, gpu: str, size: str, batch: int, seq: int, tokens_per_s: float,
            accumulate: int = 1, ac: str = "none") -> Row:
    """One of llm-foundry's 8-GPU MPT runs (FSDP, 80 GB GPUs, no memory published): its
    configuration said once, as the table's text and as llama_step.py's arguments."""
    args = ["--size", f"mpt-{size}", "--batch", str(batch)]
    if accumulate > 1:
        args += ["--accum", str(accumulate)]
    args += ["--seq", str(seq)]
    if ac != "none":
        args += ["--ac", ac]
    accumulated = f", {accumulate} accumulated" if accumulate > 1 else ""
    checkpointing = "no AC" if ac == "none" else f"{ac} AC"
    row_id = ("" if gpu == "H100" else f"{gpu.lower()}-") + \
        f"mpt-{size}-{seq // 1024}k" + ("-ac" if ac != "none" else "")
    return Row(row_id, source,
               f"MPT {size.upper()}, FSDP, 8 {gpu} 80GB, micro-batch {batch} x {seq}"
               f"{accumulated}, {checkpointing}", tokens_per_s, None, f"8x{gpu}",
               (*args, "--loss", "fused"))


def compiled(row_id: str, table: str, with_compile: tuple, with_float8: tuple) -> list:
    """torchtitan's rows of run `row_id` with torch.compile, then with Float8 too, each its
    (tokens/s per GPU, GiB): listed, not modelled."""
    return [Row(f"{row_id}-compile", f"{TORCHTITAN}, {table}", "the same with torch.compile",
                *with_compile, not_modelled="torch.compile"),
            Row(f"{row_id}-compile-float8", f"{TORCHTITAN}, {table}",
                "the same with torch.compile and Float8", *with_float8,
                not_modelled="torch.compile, float8 (torchao)")]


def chosen(parser, given: str | None, rows: list, what: str = "row") -> list:
    """The rows whose ids `given` names, comma-separated (all of them without it); the
    parser's error naming any that is not one."""
    if not given:
        return rows
    wanted = given.split(",")
    unknown = sorted(set(wanted) - {r.id for r in rows})
    if unknown:
        parser.error(f"no {what} {', '.join(unknown)}; the {what}s: "
                     f"{', '.join(r.id for r in rows)}")
    return [r for r in rows if r.id in wanted]


ROWS = [
    Row("torchtitan-8b-fsdp", f"{TORCHTITAN}, Table 1",
        "Llama 3.1 8B, FSDP, 8 H100 96GB 500 W, batch 2 x 8192, selective AC",
        5762, 82.4, "8xH100:95GiB@h100-96gb-500w",
        ("--size", "8B", "--batch", "2", "--seq", "8192", "--ac", "selective")),
    *compiled("torchtitan-8b-fsdp", "Table 1", (6667, 77.0), (8532, 76.8)),
    Row("torchtitan-8b-fsdp-128", f"{TORCHTITAN}, Table 3",
        "Llama 3.1 8B, FSDP, 128 H100 96GB 500 W (16 nodes), batch 2 x 8192, selective AC",
        5605, 67.0, "8xH100:95GiB@h100-96gb-500w",
        ("--size", "8B", "--batch", "2", "--seq", "8192", "--ac", "selective"), nodes=16),
    *compiled("torchtitan-8b-fsdp-128", "Table 3", (6514, 62.0), (8380, 61.8)),
    Row("torchtitan-70b-2d-256", f"{TORCHTITAN}, Table 4",
        "Llama 3.1 70B, FSDP 32 x TP 8, 256 H100 96GB 500 W (32 nodes), local batch 16, full "
        "AC, torch.compile and Float8", 829, 71.9, not_modelled="torch.compile, float8 (torchao)"),
    Row("torchtitan-70b-2d-256-async-tp", f"{TORCHTITAN}, Table 4",
        "the same with asynchronous TP", 876, 67.6,
        not_modelled="torch.compile, float8 (torchao), asynchronous TP"),
    Row("torchtitan-405b-3d-512-1f1b", f"{TORCHTITAN}, Table 5",
        "Llama 3.1 405B, FSDP 8 x TP 8 x PP 8 (1F1B), 512 H100 96GB 500 W (64 nodes), local "
        "batch 32, full AC, torch.compile, Float8 and asynchronous TP", 100, 82.5,
        not_modelled="pipeline parallelism, torch.compile, float8 (torchao), asynchronous TP"),
    Row("torchtitan-405b-3d-512-interleaved", f"{TORCHTITAN}, Table 5",
        "the same with the interleaved 1F1B schedule", 128, 72.7,
        not_modelled="pipeline parallelism, torch.compile, float8 (torchao), asynchronous TP"),
    mpt_row(LLM_FOUNDRY, "H100", "760m", 24, 2048, 63147, accumulate=2),
    mpt_row(LLM_FOUNDRY, "H100", "1b", 14, 2048, 45455),
    mpt_row(LLM_FOUNDRY, "H100", "7b", 6, 2048, 10643),
    mpt_row(LLM_FOUNDRY, "H100", "7b", 16, 4096, 8611, accumulate=2, ac="full"),
    mpt_row(LLM_FOUNDRY, "H100", "13b", 2, 2048, 4792),
    mpt_row(LLM_FOUNDRY_A100, "A100", "760m", 24, 2048, 32434, accumulate=2),
    mpt_row(LLM_FOUNDRY_A100, "A100", "3b", 10, 2048, 10811, accumulate=2),
    mpt_row(LLM_FOUNDRY_A100, "A100", "7b", 6, 2048, 4641, accumulate=2),
]

# What llama_step.py prints on GPU 0.
LINE = re.compile(r"peak reserved (?P<reserved>[\d.]+) GiB on GPU 0; step \d+ "
                  r"(?P<step>[\d.e+-]+) s \(predicted on (?P<platform>[\w.-]+)\), "
                  r"(?P<tps>[\d,]+) tokens/s per GPU")


@dataclasses.dataclass
class Prediction:
    step_seconds: float
    tokens_per_s: float
    reserved_gib: float
    platform: str
    wall_seconds: float


def simulated(node: str, nodes: int, program: list) -> tuple[list, dict]:
    """`sgpu run` of `program` on `nodes` simulated nodes of `node` (SGPU_SIM's spec: "8xH100",
    ...) in shape-only compute, several as a folded world (--sim-fold), untracked: the command
    and its environment."""
    cli = os.environ.get("SGPU_CLI") or str(ROOT / "build" / "bin" / "sgpu")
    folded = ["--nnodes", str(nodes), "--sim-fold"] if nodes > 1 else []
    command = [cli, "run", "--backend", "sim", "--gpus", node.split("x")[0], *folded, "--",
               *program]
    env = dict(os.environ, SGPU_SIM=node, SGPU_SIM_COMPUTE="shapes", SGPU_TRACKING="off")
    return command, env


def predict(row: Row, timeout: float = 1800) -> Prediction:
    """Runs the row's configuration on its simulated node, two steps (the second with the
    optimizer's state held, as in a long run), and reads the second's figures."""
    command, env = simulated(row.node, row.nodes,
                             [sys.executable, str(STEP), *row.args, "--steps", "2"])
    start = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - start
    match = LINE.search(done.stdout)
    if done.returncode != 0 or match is None:
        raise RuntimeError(f"{row.id}: `{' '.join(command)}` exited {done.returncode} without "
                           f"its figures:\n{done.stdout[-2000:]}{done.stderr[-4000:]}")
    return Prediction(float(match["step"]), float(match["tps"].replace(",", "")),
                      float(match["reserved"]), match["platform"], wall)


def error(predicted: float, measured: float) -> float:
    """The prediction's signed relative error: +0.05 is 5% above the measurement."""
    return predicted / measured - 1


def mean_absolute(errors: list) -> float | None:
    return sum(abs(e) for e in errors) / len(errors) if errors else None


def percent(value: float | None) -> str:
    return "" if value is None else f"{value * 100:+.1f}%"


def markdown(rows: list, predictions: dict) -> str:
    """The table, one line per row, and the mean absolute errors below it."""
    lines = ["| row | configuration | measured tokens/s/GPU | predicted | error | measured "
             "memory (GiB) | predicted | error | calibrated on it |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    errors = {True: [], False: []}
    for row in rows:
        measured_memory = "" if row.memory_gib is None else f"{row.memory_gib:.1f}"
        p = predictions.get(row.id)
        if p is None:
            lines.append(f"| {row.id} ({row.source}) | {row.configuration} | "
                         f"{row.tokens_per_s:,.0f} | not modelled: {row.not_modelled} | | "
                         f"{measured_memory} | | | |")
            continue
        e = error(p.tokens_per_s, row.tokens_per_s)
        errors[row.calibrated].append(e)
        memory_error = (None if row.memory_gib is None else
                        error(p.reserved_gib, row.memory_gib))
        lines.append(f"| {row.id} ({row.source}) | {row.configuration} | "
                     f"{row.tokens_per_s:,.0f} | {p.tokens_per_s:,.0f} ({p.step_seconds:.3f} s "
                     f"on {p.platform}) | {percent(e)} | {measured_memory} | "
                     f"{p.reserved_gib:.1f} | {percent(memory_error)} | "
                     f"{'yes' if row.calibrated else 'no'} |")
    for calibrated, label in ((False, "not used for calibration"), (True, "calibrated on")):
        mae = mean_absolute(errors[calibrated])
        if mae is not None:
            lines.append(f"\nMean absolute error of tokens/s/GPU on the {len(errors[calibrated])}"
                         f" rows {label}: {mae * 100:.1f}%.")
    return "\n".join(lines) + "\n"


def benchmark_rows(rows: list, predictions: dict) -> list:
    """The predicted rows as Google Benchmark rows (ci/bench-compare reads them)."""
    out = []
    for row in rows:
        p = predictions.get(row.id)
        if p is None:
            continue
        name = f"predictions/{row.id}"
        out.append({"name": name, "run_name": name, "run_type": "iteration", "repetitions": 1,
                    "repetition_index": 0, "threads": 1, "iterations": 1,
                    "real_time": p.wall_seconds, "cpu_time": p.wall_seconds, "time_unit": "s",
                    "model_step_ms": p.step_seconds * 1e3,
                    "model_tokens_per_s": p.tokens_per_s,
                    "memory_reserved_bytes": round(p.reserved_gib * 2**30)})
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", help="the rows to run, by id, comma-separated (default all)")
    parser.add_argument("--markdown", metavar="FILE", help="also write the table here")
    parser.add_argument("--json", metavar="FILE",
                        help="also write the predictions as Google Benchmark JSON, for "
                             "ci/bench-compare --counters-only")
    args = parser.parse_args(argv)
    rows = chosen(parser, args.rows, ROWS)
    predictions = {}
    for row in rows:
        if row.not_modelled:
            continue
        predictions[row.id] = p = predict(row)
        print(f"{row.id}: {p.tokens_per_s:,.0f} tokens/s/GPU predicted, {row.tokens_per_s:,.0f} "
              f"measured ({percent(error(p.tokens_per_s, row.tokens_per_s))}); "
              f"{p.reserved_gib:.1f} GiB reserved; {p.wall_seconds:.0f} s here", flush=True)
    table = markdown(rows, predictions)
    print(table)
    if args.markdown:
        pathlib.Path(args.markdown).write_text(table)
    if args.json:
        context = {"date": time.strftime("%Y-%m-%dT%H:%M:%S"), "backend": "sim",
                   "benchmark": "validate_predictions.py"}
        with open(args.json, "w") as out:
            json.dump({"context": context, "benchmarks": benchmark_rows(rows, predictions)}, out,
                      indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
