#!/usr/bin/python3
"""Submits a job to tandemd and prints its progress until it ends.

    bazel build //proto:tandem_py_proto        # the generated stubs, once
    /usr/bin/python3 clients/python/examples/submit_and_watch.py \\
        [--server=127.0.0.1:50051] [--token=T] [clients/examples/fmnist-mlp.yaml]

Exit status: 0 when the job succeeds, 1 when it fails, 3 when it is cancelled
(as `tandem submit --watch`), 2 when the daemon refuses the job.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from tandem_client import TandemClient, TandemError, job_pb2  # noqa: E402

DEFAULT_SPEC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples",
                            "fmnist-mlp.yaml")


def print_event(event):
    """The callback: one line per event."""
    kind = event.WhichOneof("payload")
    if kind == "step":
        s = event.step
        print("step %d/%d  loss %.4f  %.0f samples/s  %.1f ms/step  eta %.0fs" % (
            s.step, s.total_steps, s.loss, s.samples_per_second, 1000 * s.step_seconds, s.eta_seconds))
    elif kind == "eval":
        print("eval at step %d: loss %.4f, accuracy %.2f%%" % (
            event.eval.step, event.eval.loss, 100 * event.eval.accuracy))
    elif kind == "state_change":
        c = event.state_change
        print("state %s%s" % (job_pb2.JobState.Name(c.to), " (%s)" % c.reason if c.reason else ""))
    elif kind == "checkpoint":
        print("checkpoint at step %d (%d bytes)" % (event.checkpoint.step, event.checkpoint.bytes))
    elif kind == "log":
        print("log: %s" % event.log.message)
    sys.stdout.flush()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec", nargs="?", default=DEFAULT_SPEC, help="job file (YAML or JSON)")
    parser.add_argument("--server", default="127.0.0.1:50051", help="tandemd address")
    parser.add_argument("--token", default=None, help="bearer token (--auth_token_file)")
    args = parser.parse_args()

    with TandemClient(args.server, token=args.token) as client:
        try:
            job = client.submit(args.spec)
        except TandemError as e:
            print("submit refused: %s" % e, file=sys.stderr)
            return 2
        print("submitted %s" % job.id)
        state = client.watch(job.id, print_event)
        final = client.get(job.id)
        print("%s %s after %d steps%s" % (job.id, job_pb2.JobState.Name(state), final.progress.step,
                                           ", eval accuracy %.2f%%" % (100 * final.metrics.eval_accuracy)
                                           if final.metrics.eval_step else ""))
        return {job_pb2.JOB_STATE_SUCCEEDED: 0, job_pb2.JOB_STATE_FAILED: 1}.get(state, 3)


if __name__ == "__main__":
    sys.exit(main())
