"""Checks the daemons' /metrics with the real Prometheus tools, on loopback:
a coordinator and two workers (each --metrics_listen=127.0.0.1:0) train
examples/addition.json cut to a few steps; every daemon's scrape passes
`promtool check metrics` (names, types, help, units) and holds the metrics
docs/operations.md promises; then a real Prometheus server, started here
with a configuration naming the three targets, scrapes them, and its HTTP
API must say up == 1 for each and a positive shardline_job_tokens_total.
Every process started here is stopped by its pid; Prometheus' port is read
from /proc (it cannot report a port 0 choice).

Usage: check_prometheus.py BIN_DIR SOURCE_DIR WORKDIR
Exit 77 (skipped) where promtool or prometheus is not installed.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request

STEPS = 40


class Daemons:
    """Processes started here, stopped (SIGTERM, then SIGKILL) at the end."""

    def __init__(self, workdir):
        self.workdir = workdir
        self.procs = []

    def start(self, name, argv):
        log = open(os.path.join(self.workdir, name + ".log"), "w")
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        self.procs.append((name, proc))
        return proc

    def stop_all(self):
        for _, proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.time() + 20
        for _, proc in reversed(self.procs):
            try:
                proc.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def wait_for_file(path, proc, seconds=30):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if os.path.exists(path):
            text = open(path).read().strip()
            if text:
                return text
        if proc.poll() is not None:
            raise SystemExit("%s exited (%s) before writing %s" % (proc.args[0], proc.returncode, path))
        time.sleep(0.05)
    raise SystemExit("%s never came" % path)


def scrape(port):
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10) as r:
        assert r.status == 200, r.status
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4"), r.headers["Content-Type"]
        return r.read().decode()


def sample(text, name, labels=None):
    """The value of the series `name` whose labels include `labels`."""
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$", line)
        if not m or m.group(1) != name:
            continue
        have = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(3) or ""))
        if all(have.get(k) == v for k, v in (labels or {}).items()):
            return float(m.group(4))
    return None


def listening_port(pid):
    """The TCP port process `pid` listens on (from /proc: its sockets'
    inodes among the kernel's listening sockets)."""
    inodes = set()
    for fd in os.listdir("/proc/%d/fd" % pid):
        try:
            target = os.readlink("/proc/%d/fd/%s" % (pid, fd))
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    for table in ("/proc/%d/net/tcp" % pid, "/proc/%d/net/tcp6" % pid):
        for line in open(table).read().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
                return int(fields[1].split(":")[1], 16)
    return None


def promtool_check(promtool, text, what):
    r = subprocess.run([promtool, "check", "metrics"], input=text.encode(), capture_output=True, timeout=60)
    if r.returncode != 0 or r.stdout.strip() or r.stderr.strip():
        raise SystemExit("promtool check metrics on %s:\n%s%s" % (what, r.stdout.decode(), r.stderr.decode()))


def query(port, expr):
    url = "http://127.0.0.1:%d/api/v1/query?%s" % (port, urllib.parse.urlencode({"query": expr}))
    with urllib.request.urlopen(url, timeout=10) as r:
        body = json.load(r)
    assert body["status"] == "success", body
    return body["data"]["result"]


def check_tensor_parallel_bytes(ctl, address, spec, path, metrics_ports):
    """A one-stage job split over the two workers (t = 2): each counts the
    bytes its tensor group's collectives brought it; the pipeline job before
    brought none."""
    before = {n: sample(scrape(metrics_ports[n]), "shardline_worker_tensor_collective_received_bytes_total")
              for n in ("w0", "w1")}
    assert before == {"w0": 0, "w1": 0}, before
    spec = dict(spec, name="tensor")
    spec["train"] = dict(spec["train"], steps=4, eval_every=0)
    spec["parallel"] = dict(spec["parallel"], pipeline_stages=1, tensor_parallel=2)
    spec["checkpoint"] = {"every_steps": 4}
    with open(path("tensor.json"), "w") as f:
        json.dump(spec, f)
    r = subprocess.run([ctl, "--coordinator=" + address, "-o", "json", "submit", path("tensor.json")],
                       capture_output=True, timeout=60, text=True)
    assert r.returncode == 0, r.stderr
    job = json.loads(r.stdout)["job_id"]
    r = subprocess.run([ctl, "--coordinator=" + address, "watch", job], capture_output=True, timeout=300, text=True)
    assert r.returncode == 0, (r.stdout, r.stderr)
    after = {n: sample(scrape(metrics_ports[n]), "shardline_worker_tensor_collective_received_bytes_total")
             for n in ("w0", "w1")}
    assert all(v > 0 for v in after.values()), after
    seconds = {n: sample(scrape(metrics_ports[n]), "shardline_worker_tensor_collective_seconds_total")
               for n in ("w0", "w1")}
    assert all(v > 0 for v in seconds.values()), seconds
    print("tensor-parallel job %s: collective bytes %s, seconds %s" % (job, after, seconds))
    return job


def check_delete_drops_the_series(ctl, address, job, kept, port):
    """shardctl delete: the job's series leave the coordinator's scrape, the
    other job's stay."""
    r = subprocess.run([ctl, "--coordinator=" + address, "delete", job], capture_output=True, timeout=60, text=True)
    assert r.returncode == 0 and r.stdout.startswith("deleted %s (succeeded; " % job), (r.stdout, r.stderr)
    c = scrape(port)
    assert 'job_id="%s"' % job not in c, c
    assert sample(c, "shardline_job_steps_total", {"job_id": kept}) == 4, c
    assert sample(c, "shardline_jobs", {"state": "succeeded"}) == 1, c
    print("deleted %s: its series are gone, %s's remain" % (job, kept))


def main():
    if len(sys.argv) != 4:
        raise SystemExit(__doc__)
    bin_dir, source_dir, workdir = sys.argv[1:]
    promtool, prometheus = shutil.which("promtool"), shutil.which("prometheus")
    if promtool is None or prometheus is None:
        print("skipped: promtool or prometheus is not installed (Debian's prometheus package)")
        sys.exit(77)
    shutil.rmtree(workdir, ignore_errors=True)
    os.makedirs(workdir)
    daemons = Daemons(workdir)
    try:
        run(bin_dir, source_dir, workdir, daemons, promtool, prometheus)
    finally:
        daemons.stop_all()


def run(bin_dir, source_dir, workdir, daemons, promtool, prometheus):
    path = lambda name: os.path.join(workdir, name)
    coordinator = daemons.start("coordinator", [
        os.path.join(bin_dir, "shardline-coordinator"), "--listen=127.0.0.1:0", "--state_dir=" + path("state"),
        "--port_file=" + path("coordinator.port"), "--lease_ms=2000", "--metrics_listen=127.0.0.1:0",
        "--metrics_port_file=" + path("coordinator.metrics")])
    address = "127.0.0.1:" + wait_for_file(path("coordinator.port"), coordinator)
    metrics_ports = {"coordinator": int(wait_for_file(path("coordinator.metrics"), coordinator))}
    for i in range(2):
        worker = daemons.start("w%d" % i, [
            os.path.join(bin_dir, "shardline-worker"), "--coordinator=" + address, "--name=w%d" % i,
            "--threads=1", "--listen=127.0.0.1:0", "--port_file=" + path("w%d.port" % i),
            "--metrics_listen=127.0.0.1:0", "--metrics_port_file=" + path("w%d.metrics" % i)])
        wait_for_file(path("w%d.port" % i), worker)
        metrics_ports["w%d" % i] = int(wait_for_file(path("w%d.metrics" % i), worker))

    spec = json.load(open(os.path.join(source_dir, "examples", "addition.json")))
    spec["train"]["steps"] = STEPS
    spec["train"]["optimizer"]["warmup_steps"] = 2
    spec["parallel"]["pipeline_stages"] = 2
    spec.setdefault("checkpoint", {})["every_steps"] = STEPS // 2
    spec["train"]["eval_every"] = STEPS // 2  # validation passes: exact match on the cluster
    with open(path("spec.json"), "w") as f:
        json.dump(spec, f)
    ctl = os.path.join(bin_dir, "shardctl")
    submitted = subprocess.run([ctl, "--coordinator=" + address, "-o", "json", "submit", path("spec.json")],
                               capture_output=True, timeout=60, text=True)
    assert submitted.returncode == 0, submitted.stderr
    job = json.loads(submitted.stdout)["job_id"]
    # While it runs, a worker's links hold staging slots.
    staged = 0
    deadline = time.time() + 60
    while staged == 0 and time.time() < deadline:
        staged = sample(scrape(metrics_ports["w0"]), "shardline_worker_staging_bytes") or 0
        time.sleep(0.02)
    assert staged > 0, "no staging memory seen while the job ran"
    watched = subprocess.run([ctl, "--coordinator=" + address, "watch", job], capture_output=True, timeout=300,
                             text=True)
    assert watched.returncode == 0, (watched.stdout, watched.stderr)

    scrapes = {name: scrape(port) for name, port in metrics_ports.items()}
    for name, text in scrapes.items():
        promtool_check(promtool, text, name)
    c = scrapes["coordinator"]
    assert sample(c, "shardline_build_info", {"daemon": "coordinator"}) == 1, c
    assert sample(c, "shardline_jobs", {"state": "succeeded"}) == 1, c
    assert sample(c, "shardline_jobs", {"state": "running"}) == 0, c
    assert sample(c, "shardline_workers", {"state": "idle"}) == 2, c
    # w0 and w1 measure their two directions as they go idle: before, during or after the job.
    queued = sample(c, "shardline_link_probes", {"state": "queued"})
    running = sample(c, "shardline_link_probes", {"state": "running"})
    assert queued is not None and running is not None and 0 <= running <= queued <= 2, c
    assert sample(c, "shardline_job_steps_total", {"job_id": job}) == STEPS, c
    tokens = sample(c, "shardline_job_tokens_total", {"job_id": job})
    # Every step of the addition task trains on as many tokens (the answers').
    assert tokens is not None and tokens > 0 and tokens % STEPS == 0, c
    assert sample(c, "shardline_job_step_seconds_count", {"job_id": job}) == STEPS, c
    accuracy = sample(c, "shardline_job_validation_accuracy", {"job_id": job})
    assert accuracy is not None and 0 <= accuracy <= 1, c
    latest = sample(c, "shardline_job_validation_loss", {"job_id": job})
    assert (latest or 0) > 0, c
    best = sample(c, "shardline_job_best_validation_loss", {"job_id": job})
    assert best is not None and 0 < best <= latest, c
    # Addition: the best pass's exact match beside its loss.
    best_accuracy = sample(c, "shardline_job_best_validation_accuracy", {"job_id": job})
    assert best_accuracy is not None and 0 <= best_accuracy <= 1, c
    for stage in ("0", "1"):
        busy = sample(c, "shardline_position_busy_ratio", {"job_id": job, "stage": stage})
        bubble = sample(c, "shardline_position_bubble_ratio", {"job_id": job, "stage": stage})
        assert busy is not None and 0 < busy <= 1 and abs(busy + bubble - 1) < 1e-9, c
    link_bytes = 0
    for name in ("w0", "w1"):
        w = scrapes[name]
        assert sample(w, "shardline_build_info", {"daemon": "worker"}) == 1, w
        assert sample(w, "shardline_worker_info", {"name": name}) == 1, w
        assert sample(w, "shardline_worker_serving") == 1, w
        # No job runs now: no staging slots held.
        assert sample(w, "shardline_worker_staging_slots", {"state": "in_use"}) == 0, w
        assert sample(w, "shardline_worker_staging_bytes") == 0, w
        assert sample(w, "shardline_worker_steps_total") == STEPS, w
        assert sample(w, "shardline_worker_step_seconds_count") == STEPS, w
        assert sample(w, "shardline_worker_busy_seconds_total") > 0, w
        link_bytes += sample(w, "shardline_worker_link_received_bytes_total")
        # The phases of its steps (from their traces) add up to at most the steps' time.
        phases = {p: sample(w, "shardline_worker_phase_seconds_total", {"phase": p})
                  for p in ("forward", "backward", "receive", "send", "norm", "optimizer", "flush")}
        assert all(v is not None and v > 0 for v in phases.values()), phases
        step_total = sample(w, "shardline_worker_step_seconds_sum")
        assert sum(v for v in phases.values() if v) <= step_total * 1.01 + 0.01, (phases, step_total)
    # Activations one way, gradients the other: every step moves bytes.
    assert link_bytes > 0
    uploads = sum(sample(scrapes[n], "shardline_worker_checkpoint_uploads_total") for n in ("w0", "w1"))
    assert uploads >= 2, uploads  # each stage's shard at every_steps and at the end
    print("scrapes pass promtool; job %s: %d tokens in %d steps" % (job, tokens, STEPS))

    # A real Prometheus server scraping the three daemons.
    config = path("prometheus.yml")
    with open(config, "w") as f:
        f.write("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n"
                "  - job_name: shardline\n    static_configs:\n      - targets: [%s]\n"
                % ", ".join("'127.0.0.1:%d'" % p for p in metrics_ports.values()))
    r = subprocess.run([promtool, "check", "config", config], capture_output=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    server = daemons.start("prometheus", [
        prometheus, "--config.file=" + config, "--storage.tsdb.path=" + path("tsdb"),
        "--web.listen-address=127.0.0.1:0", "--log.level=warn"])
    port = None
    deadline = time.time() + 60
    while port is None and time.time() < deadline:
        if server.poll() is not None:
            raise SystemExit("prometheus exited: see " + path("prometheus.log"))
        port = listening_port(server.pid)
        time.sleep(0.2)
    assert port is not None, "prometheus never listened"
    want = {"127.0.0.1:%d" % p for p in metrics_ports.values()}
    while time.time() < deadline:
        try:
            up = {r["metric"]["instance"]: r["value"][1] for r in query(port, "up")}
            tokens_seen = query(port, 'shardline_job_tokens_total{job_id="%s"}' % job)
        except OSError:
            up, tokens_seen = {}, []
        if set(up) == want and all(v == "1" for v in up.values()) and tokens_seen:
            assert float(tokens_seen[0]["value"][1]) == tokens, tokens_seen
            print("prometheus on port %d: up == 1 for %s; shardline_job_tokens_total %s"
                  % (port, sorted(up), tokens_seen[0]["value"][1]))
            kept = check_tensor_parallel_bytes(ctl, address, spec, path, metrics_ports)
            check_delete_drops_the_series(ctl, address, job, kept, metrics_ports["coordinator"])
            return
        time.sleep(0.5)
    raise SystemExit("prometheus did not see every target up with tokens: up=%s" % up)


if __name__ == "__main__":
    main()
