"""Runs the transport and pipeline benchmarks small and checks what they write.

The figures themselves depend on the machine and are not judged here (they
belong in docs/benchmarks.md), but for the capped wire below; what is checked is that each benchmark runs
to the end, writes one JSON row per configuration asked for, with every
field present, finite and consistent with the others, and, for the
pipeline, that training over real gRPC links on the CPU gives exactly the
single-process trainer's losses.

Where this process may create network namespaces (root, iproute2), it also
runs the transport benchmark across a veth pair capped at 1 Gbit/s
(bench/bench_transport_netns.sh) and checks that every path's figure is
that of the capped wire, not of loopback.

Usage: check_bench_json.py BIN_DIR WORKDIR SOURCE_DIR
"""
import json
import math
import os
import shutil
import subprocess
import sys

TRANSPORT_SIZES = [65536, 1048576]
PIPELINE_STAGES = [2]


def run(args, json_path):
    subprocess.run(args + ["--json=" + json_path], check=True, timeout=240,
                   stdout=subprocess.DEVNULL)
    with open(json_path) as f:
        return json.load(f)


def close(a, b):
    return math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-9)


def check_fields(row, fields):
    for field in fields:
        value = row.get(field)
        assert isinstance(value, (int, float)) and math.isfinite(value), (field, row)


def check_transport(bin_dir, workdir):
    rows = run([os.path.join(bin_dir, "bench_transport"),
                "--sizes=" + ",".join(map(str, TRANSPORT_SIZES)), "--reps=8", "--trials=1"],
               os.path.join(workdir, "transport.json"))
    assert [r["bytes"] for r in rows] == TRANSPORT_SIZES, rows
    for r in rows:
        check_fields(r, ["reps", "stagelink_gbps", "tcp_gbps", "protobuf_gbps", "stagelink_vs_tcp",
                         "stagelink_vs_protobuf", "stagelink_cpu_s_per_gb", "tcp_cpu_s_per_gb",
                         "protobuf_cpu_s_per_gb"])
        assert r["reps"] == 8, r
        for path in ("stagelink", "tcp", "protobuf"):
            assert r[path + "_gbps"] > 0, r
            assert r[path + "_cpu_s_per_gb"] > 0, r
        assert close(r["stagelink_vs_tcp"], r["stagelink_gbps"] / r["tcp_gbps"]), r
        assert close(r["stagelink_vs_protobuf"], r["stagelink_gbps"] / r["protobuf_gbps"]), r


def can_make_network_namespaces():
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None:
        return False
    probe = "slbenchprobe%d" % os.getpid()
    if subprocess.run(["ip", "netns", "add", probe], capture_output=True).returncode != 0:
        return False
    # The token bucket too (the kernel may lack it).
    shaped = subprocess.run(["ip", "netns", "exec", probe, "tc", "qdisc", "add", "dev", "lo", "root",
                             "tbf", "rate", "1gbit", "burst", "4mb", "latency", "50ms"],
                            capture_output=True).returncode == 0
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return shaped


def check_transport_across_capped_veth(bin_dir, workdir, source_dir):
    if not can_make_network_namespaces():
        print("capped-veth check skipped: cannot create shaped network namespaces here")
        return
    json_path = os.path.join(workdir, "transport_netns.json")
    env = dict(os.environ, BENCH_TRANSPORT=os.path.join(bin_dir, "bench_transport"))
    subprocess.run([os.path.join(source_dir, "bench", "bench_transport_netns.sh"), "1gbit",
                    "--sizes=1048576", "--reps=32", "--trials=1", "--json=" + json_path],
                   check=True, timeout=240, stdout=subprocess.DEVNULL, env=env)
    with open(json_path) as f:
        rows = json.load(f)
    assert [r["bytes"] for r in rows] == [1048576], rows
    # 1 Gbit/s is 0.125 GB/s; the token bucket lets a few MB through at once.
    for path in ("stagelink", "tcp", "protobuf"):
        assert 0.05 < rows[0][path + "_gbps"] < 0.2, rows


def check_pipeline(bin_dir, workdir):
    rows = run([os.path.join(bin_dir, "bench_pipeline"),
                "--stages=" + ",".join(map(str, PIPELINE_STAGES)), "--steps=1", "--threads=2"],
               os.path.join(workdir, "pipeline.json"))
    assert [r["stages"] for r in rows] == PIPELINE_STAGES, rows
    for r in rows:
        check_fields(r, ["micro_batches", "tokens_per_s", "efficiency", "analytic_bound",
                         "efficiency_vs_bound", "exposed_comm_ms", "step_ms", "peak_slots",
                         "link_peak_mib", "staging_slots_peak", "peak_rss_mib",
                         "reference_tokens_per_s", "vs_reference", "max_loss_gap"])
        p, m = r["stages"], r["micro_batches"]
        assert m == 4 * p, r
        assert close(r["analytic_bound"], 1 - (p - 1) / (m + p - 1)), r
        # Busy time is within the step on every stage.
        assert 0 < r["efficiency"] <= 1 + 1e-9, r
        assert close(r["efficiency_vs_bound"], r["efficiency"] / r["analytic_bound"]), r
        # 1F1B keeps at most p micro-batches' activations on a stage.
        assert 1 <= r["peak_slots"] <= p, r
        assert r["link_peak_mib"] > 0 and r["peak_rss_mib"] > 0, r
        assert r["tokens_per_s"] > 0 and r["reference_tokens_per_s"] > 0, r
        assert close(r["vs_reference"], r["tokens_per_s"] / r["reference_tokens_per_s"]), r
        # On the CPU the pipeline is the reference arithmetic, bit for bit.
        assert r["max_loss_gap"] == 0, r


def main():
    bin_dir, workdir, source_dir = sys.argv[1], sys.argv[2], sys.argv[3]
    os.makedirs(workdir, exist_ok=True)
    check_transport(bin_dir, workdir)
    check_transport_across_capped_veth(bin_dir, workdir, source_dir)
    check_pipeline(bin_dir, workdir)
    print("bench JSON checks passed")


if __name__ == "__main__":
    main()
