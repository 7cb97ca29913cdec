"""Check a cohort --trace file: valid JSON in the Chrome trace event format; every complete event
well-formed; on every (process, thread) the spans nest properly (a span that starts inside another
ends inside it); the expected ranks, threads and steps are there; and gradient sync spans overlap
backward spans in time (communication hidden behind computation), on every rank.

usage: trace_check.py TRACE.json RANKS DEVICES STEPS [--no-overlap]
--no-overlap leaves out the overlap check, for traces whose point is elsewhere: lenet's backward
takes well under a millisecond on an AVX-512 CPU, so whether a bucket's sum starts before it ends
is a race (trace.sh checks the overlap on resnet18, whose backward is long).
"""
import json
import sys
from collections import defaultdict


def fail(msg):
    print(f"trace_check: {msg}")
    sys.exit(1)


def main():
    path, ranks, devices, steps = sys.argv[1], *map(int, sys.argv[2:5])
    want_overlap = "--no-overlap" not in sys.argv[5:]
    with open(path) as f:
        doc = json.load(f)
    events = doc["traceEvents"]
    spans = [e for e in events if e.get("ph") == "X"]
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
             if e.get("ph") == "M" and e["name"] == "thread_name"}
    for e in spans:
        for key in ("name", "cat", "pid", "tid", "ts", "dur"):
            if key not in e:
                fail(f"span without {key}: {e}")
        if e["dur"] < 0:
            fail(f"negative duration: {e}")
        if (e["pid"], e["tid"]) not in names:
            fail(f"span on an unnamed thread: {e}")
    by_thread = defaultdict(list)
    for e in spans:
        by_thread[(e["pid"], e["tid"])].append(e)
    for key, lst in by_thread.items():
        lst.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack = []
        for e in lst:
            end = e["ts"] + e["dur"]
            while stack and stack[-1] <= e["ts"]:
                stack.pop()
            if stack and end > stack[-1] + 1e-3:
                fail(f"{names[key]} (pid {key[0]} tid {key[1]}): '{e['name']}' at {e['ts']} crosses the end of its enclosing span")
            stack.append(end)
    pids = {e["pid"] for e in spans}
    if pids != set(range(ranks)):
        fail(f"ranks {sorted(pids)}, expected 0..{ranks - 1}")
    overlaps = 0
    for pid in range(ranks):
        for d in range(devices):
            steps_seen = [e for e in by_thread[(pid, 2 * d)] if e["cat"] == "step"]
            if len(steps_seen) != steps:
                fail(f"rank {pid} device {d}: {len(steps_seen)} step spans, expected {steps}")
            for cat in ("data", "forward", "backward", "optimizer"):
                if not any(e["cat"] == cat for e in by_thread[(pid, 2 * d)]):
                    fail(f"rank {pid} device {d}: no {cat} span")
            for cat, whole in (("forward", "forward + loss"), ("backward", "backward")):
                nodes = [e for e in by_thread[(pid, 2 * d)] if e["cat"] == cat and e["name"] != whole]
                if not any(e["name"].endswith(" Conv2d") for e in nodes):
                    fail(f"rank {pid} device {d}: no per-node {cat} spans")
            back = [(e["ts"], e["ts"] + e["dur"]) for e in by_thread[(pid, 2 * d)] if e["name"] == "backward"]
            sync = [(e["ts"], e["ts"] + e["dur"]) for (p, t), lst in by_thread.items()
                    if p == pid and t % 1000 == 2 * d + 1 for e in lst if e["cat"] == "sync"]
            if not sync:
                fail(f"rank {pid} device {d}: no gradient sync spans")
            hit = sum(1 for s in sync if any(s[0] < b[1] and b[0] < s[1] for b in back))
            if hit == 0 and want_overlap:
                fail(f"rank {pid} device {d}: no sync span overlaps a backward span")
            overlaps += hit
    print(f"trace_check: {path}: {len(spans)} spans on {len(by_thread)} threads of {ranks} ranks, "
          f"properly nested; {overlaps} bucket syncs overlap backward")


if __name__ == "__main__":
    main()
