#!/usr/bin/env python3
"""One decode step's kernels as Nsight Compute saw them, summed by kernel (issue 32).

Reads the CSV of `ncu --csv --page raw --metrics gpu__time_duration.sum,dram__bytes_read.sum,...`
over `fathom bench ... --profiler-range` (tools/device_session.sh ncu32) and prints, per kernel
name, how many launches, their total time, the DRAM bytes they moved and that rate against the
copy ceiling given; then the sum of all kernels run alone, to set beside the step's time in a
graph (what chaining them adds or hides).

usage: ncu_step_summary.py FILE.csv [--ceiling-tbs 4.25] [--step-ms MS] [--top N]
"""
import argparse
import csv
import re
import sys
from collections import defaultdict


def rows_of(path):
    with open(path, newline="") as f:
        lines = [line for line in f if line.startswith('"')]
    reader = csv.reader(lines)
    header = next(reader)
    units = next(reader)
    return header, units, list(reader)


def scale(unit, value):
    """Seconds or bytes from an ncu value and its unit."""
    v = float(value.replace(",", ""))
    return v * {"ns": 1e-9, "usecond": 1e-6, "us": 1e-6, "msecond": 1e-3, "ms": 1e-3, "s": 1.0, "second": 1.0,
                "byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "KB": 1e3, "MB": 1e6, "GB": 1e9}.get(unit, 1.0)


def short(name):
    name = re.sub(r"\(.*", "", name)  # arguments
    name = re.sub(r"^void ", "", name)
    name = re.sub(r"fathom::cuda::(\(anonymous namespace\)::)?", "", name)
    return name


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--ceiling-tbs", type=float, default=4.25, help="copy ceiling measured in the same run (TB/s)")
    ap.add_argument("--step-ms", type=float, default=0.0, help="the step's median in a graph, for comparison")
    ap.add_argument("--top", type=int, default=30)
    a = ap.parse_args()
    header, units, rows = rows_of(a.csv)
    col = {h: i for i, h in enumerate(header)}
    need = ["Kernel Name", "gpu__time_duration.sum", "dram__bytes_read.sum"]
    missing = [n for n in need if n not in col]
    if missing:
        sys.exit(f"{a.csv}: no column {missing} (columns: {header[:12]}...)")
    write = col.get("dram__bytes_write.sum")
    by = defaultdict(lambda: [0, 0.0, 0.0, []])
    total_t = total_b = 0.0
    for r in rows:
        t = scale(units[col["gpu__time_duration.sum"]], r[col["gpu__time_duration.sum"]])
        b = scale(units[col["dram__bytes_read.sum"]], r[col["dram__bytes_read.sum"]])
        if write is not None:
            b += scale(units[write], r[write])
        e = by[short(r[col["Kernel Name"]])]
        e[0] += 1
        e[1] += t
        e[2] += b
        e[3].append(t)
        total_t += t
        total_b += b
    print(f"{len(rows)} kernels, alone: {total_t * 1e3:.3f} ms, {total_b / 1e9:.3f} GB of DRAM traffic "
          f"({total_b / total_t / 1e12:.2f} TB/s, {100 * total_b / total_t / 1e12 / a.ceiling_tbs:.1f}% of "
          f"{a.ceiling_tbs} TB/s)")
    if a.step_ms > 0:
        print(f"the step in a graph: {a.step_ms:.3f} ms ({100 * a.step_ms / (total_t * 1e3):.0f}% of the kernels' sum "
              f"alone); at the copy ceiling the traffic would take {total_b / (a.ceiling_tbs * 1e12) * 1e3:.3f} ms")
    print(f"{'kernel':60s} {'n':>5s} {'total ms':>9s} {'share':>6s} {'median us':>10s} {'MB':>9s} {'TB/s':>6s}")
    for name, (n, t, b, ts) in sorted(by.items(), key=lambda kv: -kv[1][1])[: a.top]:
        ts = sorted(ts)
        print(f"{name[:60]:60s} {n:5d} {t * 1e3:9.3f} {100 * t / total_t:5.1f}% {ts[len(ts) // 2] * 1e6:10.2f} "
              f"{b / 1e6:9.1f} {b / t / 1e12:6.2f}")


if __name__ == "__main__":
    main()
