"""Small statistics helpers: the report shows medians with their spread
(min..max over repeated runs), never a single lucky run."""

import os
import statistics


def cpu_seconds(pid):
    """utime + stime of one process, in seconds (FileNotFoundError once
    it is gone)."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def service_cpu_s(dc, service):
    """utime + stime, in seconds, of a harness instance's processes of
    one service (processes that exited meanwhile count no more)."""
    total = 0.0
    for pid in dc.pids(service):
        try:
            total += cpu_seconds(pid)
        except FileNotFoundError:
            continue
    return total


def summarize(values):
    """{"median", "min", "max", "n"} of a list of numbers (None if empty)."""
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    return {"median": statistics.median(vals), "min": min(vals),
            "max": max(vals), "n": len(vals)}


def median(values):
    s = summarize(values)
    return None if s is None else s["median"]


def percentile(sorted_vals, p):
    if not sorted_vals:
        return None
    k = min(len(sorted_vals) - 1, max(0, int(round(p / 100.0 *
                                                   (len(sorted_vals) - 1)))))
    return sorted_vals[k]
