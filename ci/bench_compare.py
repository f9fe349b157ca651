"""Compares two Google Benchmark JSON runs, per benchmark, and fails on a regression.

A benchmark regresses when its throughput (1 / real time per iteration, so bus
bandwidth for bench_collectives) drops by more than the tolerance (default 5%),
comparing the median over repetitions on each side: one slow repetition cannot fail
the comparison (the noise guard). Run with --benchmark_repetitions=K (K >= 3) to make
use of it. Rows that failed in the new run (a wrong result, a failed sweep) are
regressions too. Benchmarks found on one side only are listed, not failed.

Counters are compared too, where a benchmark reports them (bench_parallel and
bench/bench_shapes.py --json do): exact ones (--exact, by default comm_*, collectives_*,
memory_* and flops_*: the communication accounting, a shape-only step's peak memory and
FLOPs, the same run after run on any machine) must not change at all, and predicted ones
(--predicted, by default model_*: the collective and compute models' times) must stay
within --predicted-tolerance (default 1%). With --counters-only the times are not compared, only the counters: the gate
for a simulated run in CI, where timings are noise.

Google Benchmark's own comparison (Debian's libbenchmark-tools, gbench in
/usr/share/benchmark) pairs the runs and adds its Mann-Whitney U test p-value per
benchmark when it is installed with numpy and scipy; without it the same comparison
runs on the medians alone.

Exit status: 0 no regression, 1 a regression (or a changed counter), 2 unreadable input.
"""
import argparse
import json
import re
import statistics
import sys

GBENCH_DIR = "/usr/share/benchmark"
TIME_UNITS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}


def load(path):
    try:
        with open(path) as f:
            data = json.load(f)
        data["benchmarks"]
        return data
    except (OSError, ValueError, KeyError) as e:
        print(f"bench-compare: cannot read {path} as Google Benchmark JSON: {e}", file=sys.stderr)
        sys.exit(2)


def samples(data, name_filter):
    """name -> {"times": [seconds per iteration...], "error": message or None}."""
    rows = {}
    medians = {}
    for b in data["benchmarks"]:
        run_name = b.get("run_name", b["name"])
        if name_filter and not re.search(name_filter, run_name):
            continue
        if b.get("run_type") == "aggregate":
            if b.get("aggregate_name") == "median":
                medians[run_name] = b["real_time"] * TIME_UNITS[b.get("time_unit", "ns")]
            continue
        row = rows.setdefault(run_name, {"times": [], "error": None})
        if b.get("error_occurred"):
            row["error"] = b.get("error_message", "error")
            continue
        row["times"].append(b["real_time"] * TIME_UNITS[b.get("time_unit", "ns")])
    # Runs that kept only aggregates (--benchmark_report_aggregates_only) give their median.
    for name, median in medians.items():
        if name not in rows or not rows[name]["times"]:
            rows.setdefault(name, {"times": [], "error": None})["times"] = [median]
    return rows


def counters(data, name_filter):
    """run name -> {counter: [value per repetition...]}, from the iteration rows."""
    skip = {"name", "run_name", "run_type", "repetitions", "repetition_index", "threads",
            "iterations", "real_time", "cpu_time", "time_unit", "family_index",
            "per_family_instance_index", "aggregate_name", "aggregate_unit", "error_occurred",
            "error_message", "label"}
    rows = {}
    for b in data["benchmarks"]:
        run_name = b.get("run_name", b["name"])
        if name_filter and not re.search(name_filter, run_name):
            continue
        if b.get("run_type") == "aggregate" or b.get("error_occurred"):
            continue
        row = rows.setdefault(run_name, {})
        for key, value in b.items():
            if key not in skip and isinstance(value, (int, float)):
                row.setdefault(key, []).append(float(value))
    return rows


def counter_regressions(base_counters, new_counters, exact, predicted, tolerance):
    """(lines, regressions) for the counters both runs have."""
    lines, regressions = [], 0
    for name, row in new_counters.items():
        base_row = base_counters.get(name)
        if base_row is None:
            continue
        for counter, values in sorted(row.items()):
            if counter not in base_row:
                continue
            before = base_row[counter]
            if re.search(exact, counter):
                if sorted(set(before)) != sorted(set(values)):
                    regressions += 1
                    lines.append(f"{name}  {counter}: {fmt(before)} -> {fmt(values)}  "
                                 f"CHANGED (compared exactly)")
            elif re.search(predicted, counter):
                a, b = statistics.median(before), statistics.median(values)
                change = (b - a) / a if a else (0.0 if b == a else float("inf"))
                if abs(change) > tolerance:
                    regressions += 1
                    lines.append(f"{name}  {counter}: {a:.6g} -> {b:.6g} ({change:+.2%})  "
                                 f"CHANGED (beyond {tolerance:.1%})")
    return lines, regressions


def fmt(values):
    distinct = sorted(set(values))
    return ", ".join(f"{v:.10g}" for v in distinct)


def gbench_pvalues(base, new, name_filter):
    """run name -> U test p-value on real time, from Google Benchmark's own tool."""
    sys.path.insert(0, GBENCH_DIR)
    try:
        from gbench import report  # needs numpy and scipy
    except ImportError:
        return None
    def keep(data):
        kept = dict(data)
        kept["benchmarks"] = [b for b in data["benchmarks"]
                              if b.get("run_type") != "aggregate" and not b.get("error_occurred")
                              and (not name_filter or re.search(name_filter, b["name"]))]
        return kept
    pvalues = {}
    for entry in report.get_difference_report(keep(base), keep(new), utest=True):
        if entry["utest"]:
            pvalues[entry["name"]] = entry["utest"]["time_pvalue"]
    return pvalues


def context_changes(base, new):
    keys = ["host_name", "num_cpus", "backend", "ranks", "gpus", "gpu_names", "driver",
            "interconnect", "cuda_built", "nccl_built", "libtorch", "sgpu_commit"]
    changes = []
    for key in keys:
        a, b = base.get("context", {}).get(key), new.get("context", {}).get(key)
        if a != b:
            changes.append(f"  {key}: {a} -> {b}")
    return changes


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("baseline")
    parser.add_argument("new")
    parser.add_argument("--tolerance", type=float, default=0.05,
                        help="largest throughput drop that is not a regression (default 0.05)")
    parser.add_argument("--filter", default="", help="only benchmarks whose name matches")
    parser.add_argument("--exact", default=r"^(comm_|collectives_|memory_|flops_)",
                        help="counters that must not change at all (default: comm_*, "
                             "collectives_*, memory_*, flops_*)")
    parser.add_argument("--predicted", default=r"^model_",
                        help="counters held to --predicted-tolerance (default: model_*)")
    parser.add_argument("--predicted-tolerance", type=float, default=0.01,
                        help="largest relative change of a predicted counter (default 0.01)")
    parser.add_argument("--counters-only", action="store_true",
                        help="compare only the counters, not the times (a simulated run)")
    args = parser.parse_args()

    base, new = load(args.baseline), load(args.new)
    lines, counter_changes = counter_regressions(
        counters(base, args.filter), counters(new, args.filter), args.exact, args.predicted,
        args.predicted_tolerance)
    for line in lines:
        print(line)
    if args.counters_only:
        print(f"bench-compare: {counter_changes} counter(s) changed (exact: /{args.exact}/, "
              f"predicted: /{args.predicted}/ beyond {args.predicted_tolerance:.1%})")
        return 1 if counter_changes else 0

    base_rows, new_rows = samples(base, args.filter), samples(new, args.filter)
    pvalues = gbench_pvalues(base, new, args.filter)

    changes = context_changes(base, new)
    if changes:
        print("the runs' contexts differ (a changed machine, not only changed code):")
        print("\n".join(changes))

    width = max([len(n) for n in new_rows] + [len("benchmark")])
    print(f"{'benchmark':<{width}}  {'reps':>7}  {'base(us)':>12}  {'new(us)':>12}  "
          f"{'throughput':>10}  {'p(U test)':>9}  status")
    regressions = 0
    for name, row in new_rows.items():
        if name not in base_rows or not base_rows[name]["times"]:
            print(f"{name:<{width}}  only in the new run")
            continue
        base_times = base_rows[name]["times"]
        if row["error"] is not None or not row["times"]:
            regressions += 1
            print(f"{name:<{width}}  {'':>7}  {statistics.median(base_times) * 1e6:12.2f}  "
                  f"{'-':>12}  {'-':>10}  {'-':>9}  FAILED: {row['error']}")
            continue
        base_median = statistics.median(base_times)
        new_median = statistics.median(row["times"])
        change = base_median / new_median - 1  # throughput
        regressed = change < -args.tolerance
        regressions += regressed
        p = pvalues.get(name) if pvalues else None
        status = "REGRESSION" if regressed else ("faster" if change > args.tolerance else "same")
        print(f"{name:<{width}}  {len(base_times):>3}/{len(row['times']):<3}  "
              f"{base_median * 1e6:12.2f}  {new_median * 1e6:12.2f}  {change:+10.1%}  "
              f"{'-' if p is None else f'{p:.3f}':>9}  {status}")
    for name in base_rows:
        if name not in new_rows:
            print(f"{name:<{width}}  only in the baseline")
    if pvalues is None:
        print("(Google Benchmark's gbench, numpy or scipy not found: no U test)")
    print(f"bench-compare: {regressions} regression(s) beyond {args.tolerance:.0%} "
          f"(medians over repetitions), {counter_changes} counter(s) changed")
    return 1 if regressions or counter_changes else 0


if __name__ == "__main__":
    sys.exit(main())
