"""bench_heterogeneous's driver (bench/bench_heterogeneous.sh).

Inside the testbed (as its command: TESTBED_SHARDCTL set):
    heterogeneous_run.py WORK MODE...
waits until every link is measured, then for each MODE trains WORK/MODE.json
and appends a row to WORK/rows.jsonl: the layout, tokens/s and the mean
step time between the first steps' end and the last step (wall time, the
job's status polled every 0.2 s), the plan's predicted step and critical
path, and the timeline of the timed steps (WORK/MODE.trace.json) with each
position's milliseconds per step by kind of span. Outside, after the
testbed is gone:
    heterogeneous_run.py --report WORK JSON
prints the table and the ratios and writes them as JSON.

MODE "slowdown" is another experiment: a planned job during which worker
SLOW_WORKER's CPU share drops to SLOW_SHARE at step SLOW_AT (the testbed's
TESTBED_CPU_CAP: its machine got busier); its row has the tokens/s before,
while slowed and after the coordinator re-planned, the step it moved at,
the pause of the move, and both layouts (where it moved more than once,
also how often, after which step the last time, and the last layout's
tokens/s). MODE "link_slowdown" is the same
with the link of the worker holding stage 1 of replica 1 cut to
SLOW_LINK_RATE at SLOW_AT (TESTBED_LINK_RATE), on a cluster with a spare.
MODE "recovery" is "slowdown" whose worker gets its CPU share back
RECOVER_AFTER steps after the re-plan: its row adds the tokens/s once the
coordinator moved the job back (the rate its reports show rising again).
MODE "link_recovery" is "link_slowdown" on a cluster with a slower spare
whose cut link gets its rate back (FULL_LINK_RATE) RECOVER_AFTER steps
after the re-plan: its row adds the tokens/s once the coordinator's checks
found the link back and moved the job back onto it.
MODE "join" is a planned job whose worker JOIN_WORKER is drained when it is
submitted and undrained at SLOW_AT (a worker joining mid-job): tokens/s
before, and after the coordinator moved the job onto it, where it did
(bench_heterogeneous.sh does not run it: run it by hand).
MODE "idle_recovery" is "recovery" with SLOW_WORKER cut to IDLE_SLOW_SHARE
on a cluster with a slower spare: the job moves it out to the spare, and
back once, idle with its share back, a fresh GEMM probe sets its slow
reports aside.
"""
import json
import os
import shlex
import subprocess
import sys
import time

WARMUP_STEPS = 5
SLOW_WORKER, SLOW_SHARE, SLOW_AT = "a1", 0.1, 15
SLOW_LINK_RATE = "5mbit"
# Mode "recovery": SLOW_WORKER's share back to what the topology gave it,
# once the job moved off and ran RECOVER_AFTER more steps.
FULL_SHARE, RECOVER_AFTER = 0.4, 12
# Mode "idle_recovery": SLOW_WORKER down to IDLE_SLOW_SHARE, on a cluster
# whose spare is slower than it at full share but faster than that.
IDLE_SLOW_SHARE = 0.05
# Mode "link_recovery": the cut link back to its rack's rate.
FULL_LINK_RATE = "1gbit"
CPU_RECOVERY_MODES = ("recovery", "idle_recovery")
LINK_MODES = ("link_slowdown", "link_recovery")
RECOVERY_MODES = CPU_RECOVERY_MODES + ("link_recovery",)
# Mode "join": the worker that joins mid-job (drained until then).
JOIN_WORKER = "a3"
SLOWDOWN_MODES = ("slowdown", "join") + LINK_MODES + RECOVERY_MODES


def field(obj, name, default=None):
    """A proto JSON field, whichever of its two spellings it came in."""
    parts = name.split("_")
    camel = parts[0] + "".join(p.title() for p in parts[1:])
    return obj.get(name, obj.get(camel, default))


def ctl(*args, timeout=60):
    cmd = shlex.split(os.environ["TESTBED_SHARDCTL"]) + list(args)
    return subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=timeout).stdout


def wait_for_links(workers):
    want = len(workers) * (len(workers) - 1)
    for _ in range(600):
        links = json.loads(ctl("-o", "json", "get", "links"))
        got = [l for l in links.get("links", []) if not l.get("error")]
        if len(got) >= want and not field(links, "pending_probes"):
            return
        time.sleep(0.5)
    raise SystemExit("bench_heterogeneous: the links were not all measured in 300 s")


def train(work, mode):
    spec_file = os.path.join(work, mode + ".json")
    spec = json.load(open(spec_file))
    explain = ctl("plan", spec_file, "--explain")
    open(os.path.join(work, mode + ".plan.txt"), "w").write(explain)
    plan = json.loads(ctl("-o", "json", "plan", spec_file))
    job = json.loads(ctl("-o", "json", "submit", spec_file))["job_id"]
    total = spec["train"]["steps"]
    first = last = None  # (time, step)
    status = {}
    deadline = time.monotonic() + 1200
    while time.monotonic() < deadline:
        status = json.loads(ctl("-o", "json", "describe", "job", job))
        now, step = time.monotonic(), int(field(status, "step", 0))
        if first is None and step >= WARMUP_STEPS:
            first = (now, step)
        if last is None or step > last[1]:
            last = (now, step)
        if status.get("state") in ("SUCCEEDED", "FAILED", "CANCELLED"):
            break
        time.sleep(0.2)
    if status.get("state") != "SUCCEEDED" or first is None or last[1] <= first[1]:
        raise SystemExit("bench_heterogeneous: job %s (%s) did not succeed: %s" % (job, mode, status))
    step_s = (last[0] - first[0]) / (last[1] - first[1])
    # The timeline of the timed steps (chrome://tracing, Perfetto).
    ctl("trace", job, "--steps=%d:%d" % (first[1] + 1, last[1]), "-o", os.path.join(work, mode + ".trace.json"))
    tokens_per_step = spec["train"]["global_batch"] * spec["model"]["context"]
    layout = layout_of(status)
    wires = sorted({field(s, "wire_to_next", "") for s in plan.get("stages", [])} - {""})
    reduce_wires = sorted({field(s, "wire_reduce", "") for s in plan.get("stages", [])} - {""})
    predicted = float(field(status, "predicted_step_seconds", 0))
    spans = breakdown(os.path.join(work, mode + ".trace.json"))
    return {"mode": mode, "wire_dtype": spec["parallel"]["wire_dtype"], "hop_wires": wires,
            "reduce_wires": reduce_wires, "steps": total,
            "timed_steps": last[1] - first[1], "tokens_per_step": tokens_per_step,
            "step_s": round(step_s, 4), "tokens_per_s": round(tokens_per_step / step_s, 1),
            "predicted_step_s": round(predicted, 4),
            "predicted_error": round(predicted / step_s - 1, 3) if predicted > 0 else None,
            "critical_path": field(status, "critical_path", ""), "layout": layout, "ms_per_step": spans,
            "final_loss": float(status.get("loss", 0))}


def layout_of(status):
    return ["s%d r%d %s units %d-%d" % (int(field(s, "stage", 0)), int(field(s, "replica", 0)), s["worker"],
                                        int(field(s, "unit_begin", 0)), int(field(s, "unit_end", 0)) - 1)
            for s in status.get("stages", [])]


def slowdown(work, mode):
    """A planned job whose SLOW_WORKER slows down at SLOW_AT: tokens/s
    before, slowed and after the coordinator's re-plan."""
    spec_file = os.path.join(work, mode + ".json")
    spec = json.load(open(spec_file))
    if mode in CPU_RECOVERY_MODES:  # whatever an earlier mode left
        subprocess.run(shlex.split(os.environ["TESTBED_CPU_CAP"]) + [SLOW_WORKER, str(FULL_SHARE)], check=True,
                       timeout=30)
    if mode == "join":
        ctl("drain", JOIN_WORKER)
    job = json.loads(ctl("-o", "json", "submit", spec_file))["job_id"]
    seen = []  # (time, step, epoch, message)
    status, slowed_at, recovered_at, layouts = {}, None, None, {}
    idle = False  # SLOW_WORKER held no position when given its share back
    cut = None  # the worker whose link was cut
    deadline = time.monotonic() + 1200
    while time.monotonic() < deadline:
        status = json.loads(ctl("-o", "json", "describe", "job", job))
        now, step = time.monotonic(), int(field(status, "step", 0))
        epoch = int(field(status, "plan_epoch", 0))
        if status.get("state") == "RUNNING":
            seen.append((now, step, epoch, status.get("message", "")))
            layouts.setdefault(epoch, layout_of(status))
        if slowed_at is None and step >= SLOW_AT:
            if mode == "join":
                slowed = "%s undrained (joined) at step %d" % (JOIN_WORKER, step)
                change = shlex.split(os.environ["TESTBED_SHARDCTL"]) + ["undrain", JOIN_WORKER]
            elif mode in LINK_MODES:
                held = [s["worker"] for s in status.get("stages", [])
                        if int(field(s, "stage", 0)) == 1 and int(field(s, "replica", 0)) == 1]
                cut = held[0]
                slowed = "%s's link to %s at step %d" % (cut, SLOW_LINK_RATE, step)
                change = shlex.split(os.environ["TESTBED_LINK_RATE"]) + [cut, SLOW_LINK_RATE]
            else:
                share = IDLE_SLOW_SHARE if mode == "idle_recovery" else SLOW_SHARE
                slowed = "%s to %.2f CPU at step %d" % (SLOW_WORKER, share, step)
                change = shlex.split(os.environ["TESTBED_CPU_CAP"]) + [SLOW_WORKER, str(share)]
            subprocess.run(change, check=True, timeout=30)
            slowed_at = (now, step)
        moved_at = min([s for _, s, e, _ in seen if e == max(layouts)], default=0) if len(layouts) > 1 else None
        if mode in RECOVERY_MODES and recovered_at is None and moved_at is not None and \
                step >= moved_at + RECOVER_AFTER:
            back = cut if mode == "link_recovery" else SLOW_WORKER
            idle = all(s["worker"] != back for s in status.get("stages", []))
            if mode == "link_recovery":
                change = shlex.split(os.environ["TESTBED_LINK_RATE"]) + [cut, FULL_LINK_RATE]
            else:
                change = shlex.split(os.environ["TESTBED_CPU_CAP"]) + [SLOW_WORKER, str(FULL_SHARE)]
            subprocess.run(change, check=True, timeout=30)
            recovered_at = (now, step)
        if status.get("state") in ("SUCCEEDED", "FAILED", "CANCELLED"):
            break
        time.sleep(0.2)
    if status.get("state") != "SUCCEEDED" or slowed_at is None or (mode in RECOVERY_MODES and recovered_at is None):
        raise SystemExit("bench_heterogeneous: job %s (%s) did not succeed: %s" % (job, mode, status))
    epochs = sorted(layouts)
    tokens_per_step = spec["train"]["global_batch"] * spec["model"]["context"]

    def rate(points):
        """Tokens/s between the first and last step of (time, step) points,
        each step at the first time it was seen (the poller sees the last
        step of a window again and again while the next one runs: after a
        cut to a slow link, for seconds)."""
        first_seen = {}
        for t, s in points:
            first_seen.setdefault(s, t)
        points = sorted((t, s) for s, t in first_seen.items())
        if len(points) < 2 or points[-1][1] <= points[0][1]:
            return None
        return round(tokens_per_step * (points[-1][1] - points[0][1]) / (points[-1][0] - points[0][0]), 1)

    first = [(t, s) for t, s, e, _ in seen if e == epochs[0]]
    before = [(t, s) for t, s in first if WARMUP_STEPS <= s <= slowed_at[1]]
    during = [(t, s) for t, s in first if s >= slowed_at[1] + 3]
    open(os.path.join(work, mode + ".links.txt"), "w").write(ctl("get", "links") + "\n" + ctl("get", "workers"))
    row = {"mode": mode, "slowed": slowed,
           "tokens_per_s_before": rate(before), "tokens_per_s_slowed": rate(during),
           "layout_before": layouts[epochs[0]], "epochs": len(epochs), "final_loss": float(status.get("loss", 0))}
    if len(epochs) > 1:
        after = [(t, s) for t, s, e, _ in seen if e == epochs[1]]
        moved = [m for _, _, e, m in seen if e == epochs[1] and m]
        row.update({"replanned_after_step": first[-1][1], "pause_s": round(after[0][0] - first[-1][0], 2),
                    "tokens_per_s_after": rate([p for p in after if p[1] >= after[0][1] + 3]),
                    "layout_after": layouts[epochs[1]], "message": moved[0] if moved else ""})
    if recovered_at is None and len(epochs) > 2:  # moved again: the last layout's rate
        final = [(t, s) for t, s, e, _ in seen if e == epochs[-1]]
        last_moved = [s for _, s, e, _ in seen if e == epochs[-2]][-1]
        row.update({"moves": len(epochs) - 1, "last_replanned_after_step": last_moved,
                    "tokens_per_s_final": rate([p for p in final if p[1] >= final[0][1] + 3]),
                    "layout_final": layouts[epochs[-1]]})
    if recovered_at is not None:
        what = "%s's link back to %s" % (cut, FULL_LINK_RATE) if mode == "link_recovery" else \
            "%s back to %.2f CPU" % (SLOW_WORKER, FULL_SHARE)
        row["recovered"] = "%s at step %d%s" % (what, recovered_at[1], " (idle)" if idle else "")
    if recovered_at is not None and len(epochs) > 2:
        second = [(t, s) for t, s, e, _ in seen if e == epochs[1]]
        back = [(t, s) for t, s, e, _ in seen if e == epochs[2]]
        moved = [m for _, _, e, m in seen if e == epochs[2] and m]
        row.update({"moved_back_after_step": second[-1][1], "steps_to_move_back": second[-1][1] - recovered_at[1],
                    "seconds_to_move_back": round(second[-1][0] - recovered_at[0], 1), "pause_back_s": round(back[0][0] - second[-1][0], 2),
                    "tokens_per_s_back": rate([p for p in back if p[1] >= back[0][1] + 3]),
                    "layout_back": layouts[epochs[2]], "message_back": moved[0] if moved else ""})
    return row


def breakdown(trace_file):
    """Milliseconds per step by kind of span (forward, backward, send,
    receive, reduce, norm, optimizer) for each position, from a trace."""
    events = json.load(open(trace_file))["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "process_name"}
    spans, steps = {}, {}
    for e in events:
        if e.get("ph") != "X" or e.get("cat") in (None, "step"):
            continue
        per = spans.setdefault(names[e["pid"]], {})
        per[e["cat"]] = per.get(e["cat"], 0) + e.get("dur", 0) / 1e3
        steps.setdefault(names[e["pid"]], set()).add(e["args"].get("step"))
    return {name: {k: round(v / len(steps[name]), 1) for k, v in sorted(per.items(), key=lambda kv: -kv[1])}
            for name, per in spans.items()}


def inside(work, modes):
    workers = os.environ["TESTBED_WORKERS"].split()
    wait_for_links(workers)
    open(os.path.join(work, "links.txt"), "w").write(ctl("get", "links"))
    with open(os.path.join(work, "rows.jsonl"), "a") as rows:
        for mode in modes:
            # Links a job's observed slowdowns queued for a probe are measured
            # before the next job plans (an idle cluster probes them).
            wait_for_links(workers)
            if mode in SLOWDOWN_MODES:
                row = slowdown(work, mode)
                print("bench_heterogeneous: %s: %s tok/s before, %s slowed, %s after the re-plan, %s moved back"
                      % (mode, row["tokens_per_s_before"], row["tokens_per_s_slowed"], row.get("tokens_per_s_after"),
                         row.get("tokens_per_s_back")), flush=True)
                rows.write(json.dumps(row) + "\n")
                rows.flush()
                continue
            row = train(work, mode)
            with open(os.path.join(work, "workers.txt"), "a") as listing:
                listing.write("after %s:\n%s" % (mode, ctl("get", "workers")))
            print("bench_heterogeneous: %s: %.0f tok/s, step %.3f s (predicted %.3f s)"
                  % (mode, row["tokens_per_s"], row["step_s"], row["predicted_step_s"]), flush=True)
            rows.write(json.dumps(row) + "\n")
            rows.flush()


def report(work, out):
    rows = [json.loads(line) for line in open(os.path.join(work, "rows.jsonl"))]
    slowed = [r for r in rows if r["mode"] in SLOWDOWN_MODES]
    rows = [r for r in rows if r["mode"] not in SLOWDOWN_MODES]
    by_mode = {r["mode"]: r for r in rows}
    ratios = {}
    for mode in ("planned", "planned_auto"):
        if mode in by_mode and "in_order" in by_mode:
            ratios[mode + "_vs_in_order"] = round(by_mode[mode]["tokens_per_s"] / by_mode["in_order"]["tokens_per_s"], 3)
    if "in_order" in by_mode and "in_order_auto" in by_mode:
        ratios["in_order_auto_vs_in_order"] = round(
            by_mode["in_order_auto"]["tokens_per_s"] / by_mode["in_order"]["tokens_per_s"], 3)
    if "planned" in by_mode and "planned_auto" in by_mode:
        ratios["planned_auto_vs_planned"] = round(
            by_mode["planned_auto"]["tokens_per_s"] / by_mode["planned"]["tokens_per_s"], 3)
    result = {"bench": "bench_heterogeneous",
              "topology": open(os.path.join(work, "skewed.topology")).read(),
              "rows": rows, "ratios": ratios, "slowdowns": slowed}
    json.dump(result, open(out, "w"), indent=1)
    print("%-13s %-16s %10s %8s %12s %10s  %s" % ("mode", "wire:hops/reduce", "tokens_s", "step_s", "predicted_s",
                                                   "pred_err", "critical path"))
    for r in rows:
        wire = "%s:%s/%s" % (r["wire_dtype"], ",".join(r.get("hop_wires", [])), ",".join(r.get("reduce_wires", [])))
        print("%-13s %-16s %10.0f %8.3f %12.3f %10s  %s" % (r["mode"], wire, r["tokens_per_s"], r["step_s"],
                                                             r["predicted_step_s"], r["predicted_error"],
                                                             r["critical_path"]))
        print("           layout: " + "; ".join(r["layout"]))
        for position, spans in sorted(r["ms_per_step"].items()):
            print("           %-36s %s" % (position, " ".join("%s %.0f" % kv for kv in spans.items())))
    for name, value in ratios.items():
        print("%s: %.2fx" % (name, value))
    for r in slowed:
        print("%s (%s): %s tok/s before, %s slowed, %s after re-planning after step %s (pause %s s)"
              % (r["mode"], r["slowed"], r["tokens_per_s_before"], r["tokens_per_s_slowed"], r.get("tokens_per_s_after"),
                 r.get("replanned_after_step"), r.get("pause_s")))
        print("           before: " + "; ".join(r["layout_before"]))
        print("           after:  " + "; ".join(r.get("layout_after", ["(no re-plan)"])))
        if r.get("recovered"):
            print("           %s: moved back after step %s (pause %s s): %s tok/s"
                  % (r["recovered"], r.get("moved_back_after_step"), r.get("pause_back_s"), r.get("tokens_per_s_back")))
            print("           back:   " + "; ".join(r.get("layout_back", ["(not moved back)"])))
        if "moves" in r:
            print("           moved %d times, the last after step %s: %s tok/s"
                  % (r["moves"], r["last_replanned_after_step"], r["tokens_per_s_final"]))
            print("           last:   " + "; ".join(r["layout_final"]))
    print("json: " + out)


if __name__ == "__main__":
    if sys.argv[1] == "--report":
        report(sys.argv[2], sys.argv[3])
    else:
        inside(sys.argv[1], sys.argv[2:])
