"""Per-source-line instruction counts and stall samples of the kernels in an ncu report.

Run on the GPU machine (it needs Nsight Compute's extras/python/ncu_report.py):
  python3 bench/ncu_lines.py REPORT.ncu-rep [kernel-substring] [lines]
The report must have the SourceCounters section and code built with -lineinfo (the default).
Prints, per kernel, the source lines with the most warp-level instructions executed and the most
stall samples (with the top stall reasons), so that where a kernel spends its issue slots is read
as code, not as totals.
"""
import collections
import glob
import os
import shutil
import sys

ncu = shutil.which("ncu")
roots = [os.path.dirname(os.path.realpath(ncu))] if ncu else []
roots += glob.glob("/usr/local/cuda*/nsight-compute*") + glob.glob("/opt/nvidia/nsight-compute/*")
for root in roots:
    sys.path.extend(glob.glob(os.path.join(root, "extras", "python")))
import ncu_report  # noqa: E402

report, wanted = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else ""
top = int(sys.argv[3]) if len(sys.argv) > 3 else 25


def per_line(action, metric_name):
    """{(file, line): summed value} of an instanced metric correlated by PC."""
    metric = action.metric_by_name(metric_name)
    out = collections.Counter()
    if metric is None or not metric.has_correlation_ids():
        return out
    pcs = metric.correlation_ids()
    for i in range(metric.num_instances()):
        info = action.source_info(pcs.as_uint64(i))
        key = (os.path.basename(info.file_name()), info.line()) if info else ("?", 0)
        out[key] += metric.as_double(i)
    return out


ctx = ncu_report.load_report(report)
for r in range(ctx.num_ranges()):
    rng = ctx.range_by_idx(r)
    for a in range(rng.num_actions()):
        action = rng.action_by_idx(a)
        name = action.name()
        if wanted not in name:
            continue
        names = sorted(action.metric_names())
        instanced = [m for m in names if action.metric_by_name(m).has_correlation_ids()]
        print(f"== {name}: {len(instanced)} per-PC metrics")
        inst = per_line(action, "inst_executed") or per_line(action, "smsp__sass_inst_executed")
        total = sum(inst.values()) or 1.0
        print(f"-- warp instructions executed: {total:.4g}")
        for (f, line), v in inst.most_common(top):
            print(f"{f}:{line}  {v:.4g}  {100 * v / total:.1f}%")
        stalls = {m: per_line(action, m) for m in instanced if "pcsamp_warps_issue_stalled" in m
                  and not m.endswith("_not_issued")}
        samples = collections.Counter()
        for counts in stalls.values():
            samples.update(counts)
        total = sum(samples.values()) or 1.0
        print(f"-- stall samples: {total:.4g}")
        for key, v in samples.most_common(top):
            reasons = sorted(((c[key], m.split("stalled_")[-1]) for m, c in stalls.items()
                              if c[key] > 0), reverse=True)[:3]
            why = ", ".join(f"{m} {100 * c / v:.0f}%" for c, m in reasons)
            print(f"{key[0]}:{key[1]}  {100 * v / total:.1f}%  ({why})")
        if not inst and not samples:
            print("no per-PC data; metrics with correlation ids:", instanced[:40])
