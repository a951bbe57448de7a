#!/usr/bin/python3
"""Time to scrape tandemd's /metrics on a node that holds many jobs: --finished
short jobs (50 by default) that trained under a plan on the emulated
accelerator and SUCCEEDED, and --running jobs (5) still training, each one
thread. Every job has per-layer (tandem_layer_step_seconds) and per-resource
series, the shape of the job in tests/e2e/dashboard_test.py, at a tiny size.

The scrapes run one after another over loopback with urllib, each timed from
request to last byte; the script prints p50 / p99 / max, the size of the
exposition (bytes, lines, series) and the distinct job_id values in it, with
the CPU model and load average, so runs before and after a change to the
metrics code can be compared (on an otherwise idle machine). Takes about one
to three minutes on 2 cores.
  /usr/bin/python3 bench/server/scrape_time.py --tandemd bazel-bin/server/tandemd \
      [--baseline OTHER_TANDEMD]
With --baseline, the other build (say, before a change) is measured first in
the same run and the ratios are printed.
The Python stubs come from bazel-bin/proto (bazel build //proto:tandem_py_proto).
"""
import argparse
import os
import re
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "common"))
from machine import cpu_model  # noqa: E402
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "e2e"))
from tandemd_fixture import Tandemd  # noqa: E402
try:
    from tandem_stubs import (job_pb2, spec_from_dict, tandem_service_pb2,  # noqa: E402
                              tandem_service_pb2_grpc)
except ImportError as e:
    sys.exit("cannot import the Python stubs (%s): bazel build //proto:tandem_py_proto" % e)
import grpc  # noqa: E402

TERMINAL = (job_pb2.JOB_STATE_SUCCEEDED, job_pb2.JOB_STATE_FAILED, job_pb2.JOB_STATE_CANCELLED)


def job_spec(name, steps):
    # The dashboard test's job (reuse_distance on the emulated accelerator, so
    # it has a plan, per-layer timings and accelerator memory), made tiny.
    return spec_from_dict({
        "display_name": name,
        "model": {"mlp": {"hidden_sizes": [64, 64]}},
        "data": {"synthetic": {"sample_shape": [64], "num_classes": 10, "train_samples": 512,
                               "test_samples": 64}},
        "training": {"batch_size": 32, "steps": steps, "eval_interval_steps": 0, "threads": 1,
                     "checkpoint_disabled": True},
        "placement": {"accelerator": "ACCELERATOR_KIND_EMULATED",
                      "strategy": "STRATEGY_REUSE_DISTANCE"},
        "resources": {"accelerator_memory_bytes": 16 << 20},
    })



def load_average():
    return "%.2f %.2f %.2f" % os.getloadavg()


def pct(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * p))]


def all_jobs(client):
    jobs, token = [], ""
    while True:
        page = client.ListJobs(tandem_service_pb2.ListJobsRequest(page_size=1000, page_token=token), timeout=30)
        jobs += page.jobs
        token = page.next_page_token
        if not token:
            return {j.id: j for j in jobs}


def wait_until(client, ids, done, what, timeout):
    """Polls ListJobs until done(job) holds for every job in ids."""
    deadline = time.time() + timeout
    while True:
        jobs = all_jobs(client)
        pending = [i for i in ids if not done(jobs[i])]
        for i in ids:
            j = jobs[i]
            if j.state in TERMINAL and j.state != job_pb2.JOB_STATE_SUCCEEDED:
                raise RuntimeError("%s ended %s: %s" % (i, job_pb2.JobState.Name(j.state), j.reason))
        if not pending:
            return
        if time.time() > deadline:
            j = jobs[pending[0]]
            raise RuntimeError("%d jobs not %s after %ds; e.g. %s %s step %d: %s" % (
                len(pending), what, timeout, j.id, job_pb2.JobState.Name(j.state), j.progress.step, j.reason))
        time.sleep(0.25)


def scrape(url):
    start = time.perf_counter()
    with urllib.request.urlopen(url, timeout=60) as r:
        body = r.read()
    return time.perf_counter() - start, body


def measure(binary, args):
    """Runs the whole procedure against one tandemd binary; returns its figures."""
    print("== %s" % binary)
    print("load average before: %s" % load_average(), flush=True)
    t0 = time.time()
    daemon = Tandemd(binary, metrics=True, extra_flags=[
        "--max_running_jobs=%d" % max(2, args.running + 1), "--job_threads=1", "--store_sync=normal"])
    daemon.start()
    channel = grpc.insecure_channel(daemon.address)
    client = tandem_service_pb2_grpc.TandemStub(channel)
    running = []
    ok = False
    try:
        submit = lambda spec: client.SubmitJob(  # noqa: E731
            tandem_service_pb2.SubmitJobRequest(spec=spec), timeout=30).job.id
        finished = [submit(job_spec("scrape-finished-%d" % i, steps=5)) for i in range(args.finished)]
        wait_until(client, finished, lambda j: j.state == job_pb2.JOB_STATE_SUCCEEDED, "SUCCEEDED", 240)
        print("%d finished jobs SUCCEEDED after %.1f s" % (len(finished), time.time() - t0), flush=True)
        for i in range(args.running):
            running.append(submit(job_spec("scrape-running-%d" % i, steps=10 ** 9)))
        wait_until(client, running, lambda j: j.state == job_pb2.JOB_STATE_RUNNING and j.progress.step >= 1,
                   "RUNNING with a step", 120)
        print("%d running jobs RUNNING with a step after %.1f s" % (len(running), time.time() - t0), flush=True)

        url = "http://127.0.0.1:%d/metrics" % daemon.metrics_port
        first, _ = scrape(url)  # warm-up, not counted
        times, body = [], b""
        for _ in range(args.scrapes):
            seconds, body = scrape(url)
            times.append(seconds)
        text = body.decode()
        lines = text.splitlines()
        series = [l for l in lines if l and not l.startswith("#")]
        job_ids = set(re.findall(r'job_id="([^"]*)"', text))
        families = len(re.findall(r"^# TYPE ", text, re.M))
        p50, p99 = 1e3 * pct(times, 0.5), 1e3 * pct(times, 0.99)
        print("load average during scrapes: %s" % load_average())
        print("exposition: %d bytes, %d lines, %d series in %d families, %d distinct job_id values "
              "(%d finished + %d running submitted)" % (len(body), len(lines), len(series), families,
                                                        len(job_ids), len(finished), len(running)))
        per_family = {}
        for name, _type in re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M):
            per_family[name] = sum(1 for l in series if re.match(r"%s(_bucket|_sum|_count)?[{ ]" % name, l))
        print("series per family: " + ", ".join(
            "%s %d" % (n, c) for n, c in sorted(per_family.items(), key=lambda x: -x[1]) if c))
        print("%d scrapes: p50 %.2f ms  p99 %.2f ms  max %.2f ms  (warm-up scrape %.2f ms)" % (
            len(times), p50, p99, 1e3 * max(times), 1e3 * first))
        print("scrape_time: p50_ms=%.2f p99_ms=%.2f bytes=%d series=%d" % (p50, p99, len(body), len(series)))
        ok = True
        return {"p50": p50, "p99": p99, "bytes": len(body), "series": len(series)}
    finally:
        for job_id in running:
            try:
                client.CancelJob(tandem_service_pb2.CancelJobRequest(job_id=job_id, reason="scrape_time done"),
                                 timeout=30)
            except grpc.RpcError as e:
                print("cancel %s: %s" % (job_id, e), file=sys.stderr)
        channel.close()
        code = daemon.stop()
        if not ok or code != 0:
            sys.stderr.write("tandemd exited %s; its log:\n%s\n" % (code, daemon.logs()[-20000:]))
        daemon.cleanup()
        print("total %.1f s" % (time.time() - t0), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tandemd", default="bazel-bin/server/tandemd")
    parser.add_argument("--baseline", default="",
                        help="another tandemd build (e.g. before a change) measured in the same run")
    parser.add_argument("--scrapes", type=int, default=50)
    parser.add_argument("--finished", type=int, default=50)
    parser.add_argument("--running", type=int, default=5)
    args = parser.parse_args()

    print("cpu: %s, %d cores" % (cpu_model(), os.cpu_count()))
    results = [measure(b, args) for b in ([args.baseline] if args.baseline else []) + [args.tandemd]]
    if args.baseline:
        base, this = results
        print("tandemd / baseline: p50 %.2fx  p99 %.2fx  bytes %.2fx  series %.2fx" % (
            this["p50"] / base["p50"], this["p99"] / base["p99"], this["bytes"] / base["bytes"],
            this["series"] / base["series"]))


if __name__ == "__main__":
    main()
