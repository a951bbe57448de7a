"""Every PromQL expression of the Grafana dashboard and of the alert rules,
evaluated by a real Prometheus (Debian's) that scrapes a real tandemd which has
just run a short job (and failed one).

Each expression must parse and evaluate; each dashboard query must return data,
and each template variable must list the node and the job. The test prints
every query with its outcome, so a failure names exactly the queries that came
back empty. The alert rules are loaded into that Prometheus too: each must
evaluate without error, and TandemJobFailed must fire for the failed job.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.parse
import urllib.request

import yaml

import junit_runner
import repo_files
from tandem_stubs import all_healthy, diverging_spec, job_pb2, spec_from_dict, stub, tandem_service_pb2, wait_for_state
from tandemd_fixture import Tandemd

TANDEMD = None
FAKE_NVML = None

# Metric families the dashboard charts for a kind of job the dashboard's job
# (below) is not, so their queries come back empty for it (they must still
# parse): the pipeline rows have data only for pipeline jobs
# (docs/pipeline.md), the distributed row only for distributed jobs
# (docs/distributed.md), the mixed-precision row only for fp16 jobs. A
# pipeline job, a 2-rank job (with a peer daemon) and an fp16 job run beside
# it, so the families are registered. An entry whose queries return data for the dashboard's job fails
# this test, so the list cannot go stale.
PENDING_SERIES = ["tandem_job_pipeline_stage_seconds", "tandem_job_pipeline_stage_bytes",
                  "tandem_job_ranks", "tandem_job_collective_bytes",
                  "tandem_job_collective_seconds", "tandem_rank_collective_bytes",
                  "tandem_rank_collective_seconds", "tandem_job_loss_scale",
                  "tandem_job_skipped_steps"]

# What Grafana substitutes for its built-in variables, at a 1 s scrape interval.
BUILTINS = {"__rate_interval": "30s", "__interval": "5s", "__range": "5m"}
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def get_json(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.load(r)


def substitute(expr, values):
    for name in sorted(values, key=len, reverse=True):
        for form in ("${%s}" % name, "[[%s]]" % name, "$" + name):
            expr = expr.replace(form, values[name])
    return expr


def dashboard_queries(dashboard):
    """(where, expr) for every target of every panel, rows' panels included."""
    out = []
    for panel in dashboard["panels"]:
        for p in [panel] + panel.get("panels", []):
            for t in p.get("targets", []):
                out.append(("panel %r %s" % (p["title"], t["refId"]), t["expr"]))
    return out


def rule_queries(rules):
    return [("rule %s" % (r.get("alert") or r.get("record")), r["expr"])
            for g in rules["groups"] for r in g["rules"]]


def metric_names(expr):
    # Identifiers that are metric names: tandem_*, up, and the exposer_* families
    # prometheus-cpp's exposer adds about its own scrapes; not functions or labels.
    return set(re.findall(r"\b((?:tandem|exposer)_[a-z0-9_]+|up)\b(?!\s*\()", expr))


def pending_family(expr):
    for family in PENDING_SERIES:
        if re.search(r"\b%s(%s)?\b" % (family, "|".join(HISTOGRAM_SUFFIXES)), expr):
            return family
    return None


class DashboardTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        with open(repo_files.path("deploy/grafana/dashboards/tandem.json")) as f:
            cls.dashboard = json.load(f)
        cls.rules_path = repo_files.path("deploy/prometheus/rules/tandem.rules.yml")
        with open(cls.rules_path) as f:
            cls.rules = yaml.safe_load(f)
        # The GPU row's series come from a stand-in for libnvidia-ml with one GPU
        # of fixed readings (server/metrics/testing/fake_nvml.c).
        # A peer, so that a distributed job registers the distributed families.
        ports = repo_files.free_ports(2)
        cls.peer = Tandemd(TANDEMD, metrics=True,
                           extra_flags=["--listen=127.0.0.1:%d" % ports[1],
                                        "--peers=127.0.0.1:%d" % ports[0]]).start()
        cls.daemon = Tandemd(TANDEMD, metrics=True,
                             extra_flags=["--nvml_library=" + os.path.abspath(FAKE_NVML),
                                          "--emulated_accelerators=2",
                                          "--listen=127.0.0.1:%d" % ports[0],
                                          "--peers=127.0.0.1:%d" % ports[1]]).start()
        cls.channel, cls.client = stub(cls.daemon.address)
        cls.dir = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        cls.target = "127.0.0.1:%d" % cls.daemon.metrics_port
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [cls.rules_path],
            # The peer too: it runs the distributed job's rank 1 (the per-rank
            # families); the dashboard's $instance keeps its panels to the main daemon.
            "scrape_configs": [{"job_name": "tandemd", "static_configs": [{"targets": [
                cls.target, "127.0.0.1:%d" % cls.peer.metrics_port]}]}],
        }
        config_path = os.path.join(cls.dir, "prometheus.yml")
        with open(config_path, "w") as f:
            yaml.safe_dump(config, f)
        cls.port = repo_files.free_port()
        cls.prometheus = subprocess.Popen(
            ["prometheus", "--config.file=" + config_path, "--storage.tsdb.path=" + os.path.join(cls.dir, "tsdb"),
             "--web.listen-address=127.0.0.1:%d" % cls.port, "--log.level=warn"],
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(cls.dir, "prometheus.log"), "w"))
        cls.api = "http://127.0.0.1:%d/api/v1/" % cls.port

        # A short job that trains under a plan (reuse_distance on the emulated
        # accelerator), evaluates and succeeds, and one that fails. A threshold
        # of almost nothing makes its closed loop re-plan at its first check
        # whatever the machine's speed, so the re-plan series have data.
        job = cls.client.SubmitJob(tandem_service_pb2.SubmitJobRequest(spec=spec_from_dict({
            "display_name": "dashboard-test",
            "model": {"mlp": {"hidden_sizes": [256, 256]}},
            "data": {"synthetic": {"sample_shape": [256], "num_classes": 10, "train_samples": 4096,
                                   "test_samples": 256}},
            "training": {"batch_size": 64, "steps": 1500, "eval_interval_steps": 500,
                         "checkpoint_disabled": True},
            "placement": {"accelerator": "ACCELERATOR_KIND_EMULATED",
                          "strategy": "STRATEGY_REUSE_DISTANCE", "replan_threshold": 1e-9},
            "resources": {"accelerator_memory_bytes": 64 << 20},
        })), timeout=30).job
        # A 2-stage pipeline job: it registers the pipeline families.
        pipeline = cls.client.SubmitJob(tandem_service_pb2.SubmitJobRequest(spec=spec_from_dict({
            "display_name": "dashboard-test-pipeline",
            "model": {"mlp": {"hidden_sizes": [32]}},
            "data": {"synthetic": {"sample_shape": [16], "num_classes": 4, "train_samples": 256}},
            "training": {"batch_size": 16, "steps": 20, "checkpoint_disabled": True},
            "placement": {"accelerator": "ACCELERATOR_KIND_EMULATED", "pipeline": {"stages": 2}},
            "resources": {"accelerator_memory_bytes": 16 << 20},
        })), timeout=30).job
        # An fp16 job on the emulated accelerator: it registers the loss-scale families.
        fp16 = cls.client.SubmitJob(tandem_service_pb2.SubmitJobRequest(spec=spec_from_dict({
            "display_name": "dashboard-test-fp16",
            "model": {"mlp": {"hidden_sizes": [32]}},
            "data": {"synthetic": {"sample_shape": [16], "num_classes": 4, "train_samples": 256}},
            "training": {"batch_size": 16, "steps": 20, "checkpoint_disabled": True},
            "precision": "PRECISION_FP16",
            "placement": {"accelerator": "ACCELERATOR_KIND_EMULATED"},
            "resources": {"accelerator_memory_bytes": 16 << 20},
        })), timeout=30).job
        # A 2-rank distributed job (docs/distributed.md) once the peer is healthy.
        deadline = time.time() + 60
        while not all_healthy(cls.client.GetNode(
                tandem_service_pb2.GetNodeRequest(), timeout=10).peers):
            assert time.time() < deadline, "the peer never became healthy"
            time.sleep(0.2)
        distributed = cls.client.SubmitJob(tandem_service_pb2.SubmitJobRequest(spec=spec_from_dict({
            "display_name": "dashboard-test-distributed",
            "model": {"mlp": {"hidden_sizes": [32]}},
            "data": {"synthetic": {"sample_shape": [16], "num_classes": 4, "train_samples": 256}},
            "training": {"batch_size": 16, "steps": 20, "checkpoint_disabled": True},
            "distributed": {"replicas": 2},
        })), timeout=30).job
        failing = diverging_spec()
        cls.failed = cls.client.SubmitJob(tandem_service_pb2.SubmitJobRequest(spec=failing), timeout=30).job
        cls.job = wait_for_state(cls.client, job.id, [job_pb2.JOB_STATE_SUCCEEDED], timeout=300)
        wait_for_state(cls.client, cls.failed.id, [job_pb2.JOB_STATE_FAILED])
        wait_for_state(cls.client, pipeline.id, [job_pb2.JOB_STATE_SUCCEEDED])
        wait_for_state(cls.client, fp16.id, [job_pb2.JOB_STATE_SUCCEEDED])
        wait_for_state(cls.client, distributed.id, [job_pb2.JOB_STATE_SUCCEEDED])

        cls.values = dict(BUILTINS, instance=cls.target, job_id=cls.job.id)
        cls.families = cls.exported_families()
        # Scrapes run every second; allow the last ones after the job ended to
        # land, then keep evaluating until every query that should have data has
        # it (or a minute passes).
        deadline = time.time() + 60
        while True:
            cls.results = {where: cls.evaluate(expr) for where, expr in
                           dashboard_queries(cls.dashboard) + rule_queries(cls.rules)}
            missing = [w for w, (status, rows, _) in cls.results.items()
                       if w.startswith("panel") and status == "success" and not rows
                       and not pending_family(dict(dashboard_queries(cls.dashboard))[w])]
            if not missing or time.time() > deadline:
                break
            time.sleep(1)
        cls.report()

    @classmethod
    def tearDownClass(cls):
        cls.prometheus.terminate()
        cls.prometheus.wait(timeout=30)
        cls.channel.close()
        assert cls.daemon.stop() == 0, cls.daemon.logs()
        cls.daemon.cleanup()
        cls.peer.stop()
        cls.peer.cleanup()
        shutil.rmtree(cls.dir, ignore_errors=True)

    @classmethod
    def exported_families(cls):
        """Family name -> type, from the TYPE lines of both daemons' exposition
        (prometheus-cpp writes a registry family once it has a series)."""
        families = {}
        for port in (cls.daemon.metrics_port, cls.peer.metrics_port):
            with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10) as r:
                text = r.read().decode()
            families.update(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
        return families

    @classmethod
    def evaluate(cls, expr):
        """(status, result rows, error) of an instant query at now."""
        query = substitute(expr, cls.values)
        url = cls.api + "query?query=" + urllib.parse.quote(query)
        for _ in range(100):  # Prometheus may still be starting.
            try:
                answer = get_json(url)
                return answer["status"], answer["data"]["result"], ""
            except urllib.error.HTTPError as e:  # 400/422: the query is wrong
                body = json.loads(e.read().decode() or "{}")
                return body.get("status", "error"), [], body.get("error", str(e))
            except OSError:
                time.sleep(0.2)
        raise RuntimeError("Prometheus did not answer at %s" % cls.api)

    @classmethod
    def report(cls):
        queries = dict(dashboard_queries(cls.dashboard) + rule_queries(cls.rules))
        lines = ["", "PromQL against Prometheus scraping %s after job %s:" % (cls.target, cls.job.id)]
        for where, (status, rows, error) in cls.results.items():
            rule = where.startswith("rule")
            if status != "success":
                outcome = "ERROR " + error
            elif rows:
                outcome = "%d series%s" % (len(rows), " (alerting)" if rule else "")
            elif rule:
                outcome = "evaluates; nothing to alert on"
            elif pending_family(queries[where]):
                outcome = "no data (pending: %s)" % pending_family(queries[where])
            else:
                outcome = "NO DATA"
            lines.append("  %-60s %s" % (where, outcome))
        sys.stderr.write("\n".join(lines) + "\n")

    def test_every_expression_parses_and_evaluates(self):
        errors = ["%s: %s" % (w, e) for w, (status, _, e) in self.results.items() if status != "success"]
        self.assertEqual(errors, [])
        for where, expr in dashboard_queries(self.dashboard) + rule_queries(self.rules):
            self.assertNotIn("$", substitute(expr, self.values), "unknown variable in %s" % where)

    def test_every_dashboard_query_returns_data(self):
        queries = dict(dashboard_queries(self.dashboard))
        empty = [w for w in queries if self.results[w][0] == "success" and not self.results[w][1]
                 and not pending_family(queries[w])]
        self.assertEqual(empty, [], "dashboard queries without data (see the report above)")
        # Per-job panels show this job, per-node panels this node.
        for where, expr in queries.items():
            for row in self.results[where][1]:
                if "job_id" in row["metric"]:
                    self.assertEqual(row["metric"]["job_id"], self.job.id, where)
                if "instance" in row["metric"]:
                    self.assertEqual(row["metric"]["instance"], self.target, where)

    def test_pending_series_are_registered_and_still_pending(self):
        if not PENDING_SERIES:
            self.skipTest("no series pending")
        queries = dict(dashboard_queries(self.dashboard))
        for family in PENDING_SERIES:
            self.assertIn(family, self.families, "PENDING_SERIES names a family tandemd does not register")
            using = [w for w, e in queries.items() if pending_family(e) == family]
            self.assertTrue(using, "no dashboard query uses %s" % family)
            with_data = [w for w in using if self.results[w][1]]
            self.assertEqual(with_data, [], "%s now has series: remove it from PENDING_SERIES" % family)

    def test_every_metric_named_is_one_tandemd_exports_and_every_family_is_charted(self):
        named = set()
        for _, expr in dashboard_queries(self.dashboard) + rule_queries(self.rules):
            named |= metric_names(expr)
        for name in sorted(named - {"up"}):
            family = name
            for suffix in HISTOGRAM_SUFFIXES:
                if name.endswith(suffix) and self.families.get(name[:-len(suffix)]) == "histogram":
                    family = name[:-len(suffix)]
            self.assertIn(family, self.families, "%s is not a metric tandemd exports" % name)
            if self.families[family] == "histogram":
                self.assertNotEqual(name, family, "%s is a histogram: use _bucket, _sum or _count" % name)
        charted = set()
        for _, expr in dashboard_queries(self.dashboard):
            for name in metric_names(expr):
                charted.add(re.sub(r"_(bucket|sum|count)$", "", name) if name not in self.families else name)
        self.assertEqual(set(self.families) - charted, set(), "families the dashboard does not chart")

    def test_template_variables_list_this_node_and_this_job(self):
        expected = {"instance": self.target, "job_id": self.job.id}
        for v in self.dashboard["templating"]["list"]:
            if v["type"] != "query":
                continue
            m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", v["query"]["query"].strip())
            self.assertTrue(m, v["name"])
            status, rows, error = self.evaluate(m.group(1))
            self.assertEqual(status, "success", error)
            self.assertIn(expected[v["name"]], {r["metric"].get(m.group(2)) for r in rows}, v["name"])

    def test_prometheus_evaluates_every_rule_and_fires_job_failed(self):
        deadline, firing = time.time() + 60, []
        while time.time() < deadline:
            groups = get_json(self.api + "rules")["data"]["groups"]
            rules = [r for g in groups for r in g["rules"]]
            alerts = get_json(self.api + "alerts")["data"]["alerts"]
            firing = [a for a in alerts if a["state"] == "firing"]
            if all(r.get("lastEvaluation", "").startswith("20") for r in rules) and firing:
                break
            time.sleep(0.5)
        self.assertEqual(len(rules), len(rule_queries(self.rules)))
        for r in rules:
            self.assertEqual(r["health"], "ok", "%s: %s" % (r["name"], r.get("lastError")))
        self.assertEqual([(a["labels"]["alertname"], a["labels"]["instance"]) for a in firing],
                         [("TandemJobFailed", self.target)])


if __name__ == "__main__":
    TANDEMD = sys.argv.pop(1)
    FAKE_NVML = sys.argv.pop(1)
    junit_runner.main()
