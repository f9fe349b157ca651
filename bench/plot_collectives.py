"""Bus bandwidth against message size, one line per operation, from bench_collectives'
Google Benchmark JSON (--benchmark_out=FILE --benchmark_out_format=json).

    python bench/plot_collectives.py RUN.json OUT.png

sgpu's rows are solid lines, the floor's (plain libtorch) dashed in the same colour.
With repetitions, each point is the median over them. Needs matplotlib (ci/setup puts it
into the venv).
"""
import json
import statistics
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def size_label(n):
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale:
            return f"{n // scale}{unit}"
    return str(n)


def main(run_path, png_path):
    with open(run_path) as f:
        run = json.load(f)
    # (op, dtype, who) -> bytes -> [busbw...]
    lines = defaultdict(lambda: defaultdict(list))
    for b in run["benchmarks"]:
        if b.get("run_type") == "aggregate" or b.get("error_occurred") or "busbw_GBps" not in b:
            continue
        op, dtype, size, who = b.get("run_name", b["name"]).split("/")[:4]
        lines[(op, dtype, who)][int(size)].append(b["busbw_GBps"])
    if not lines:
        print(f"plot_collectives: no bus bandwidth rows in {run_path}", file=sys.stderr)
        return 1
    fig, ax = plt.subplots(figsize=(10, 6))
    colours = {}
    for (op, dtype, who), points in sorted(lines.items()):
        key = (op, dtype)
        if key not in colours:
            colours[key] = f"C{len(colours) % 10}"
        sizes = sorted(points)
        ax.plot(sizes, [statistics.median(points[s]) for s in sizes],
                color=colours[key], linestyle="-" if who == "sgpu" else "--",
                linewidth=1.8 if who == "sgpu" else 1.0, marker="." if who == "sgpu" else None,
                label=f"{op} {dtype}" + ("" if who == "sgpu" else " (floor)"))
    ax.set_xscale("log", base=2)
    all_sizes = sorted({s for points in lines.values() for s in points})
    ticks = all_sizes[:: max(1, len(all_sizes) // 12)]
    ax.set_xticks(ticks)
    ax.set_xticklabels([size_label(s) for s in ticks])
    ax.set_xlabel("message size (bytes, nccl-tests' convention)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    context = run.get("context", {})
    ax.set_title(f"sgpu collectives: {context.get('backend', '?')} backend, "
                 f"{context.get('ranks', '?')} ranks, {context.get('gpus', '')}; "
                 f"commit {context.get('sgpu_commit', '?')[:12]}", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(png_path, dpi=120)
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1], sys.argv[2]))
