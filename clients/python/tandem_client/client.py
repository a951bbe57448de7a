"""TandemClient: submit, watch, cancel, plan, get, list and node over gRPC.

Every unary call carries a deadline (the client's `timeout_seconds`, or the
call's own `timeout`); a failed call raises TandemError with the gRPC status
code and the server's message, which names the offending field for bad input.
WatchJob streams have no deadline (jobs run for days) and resume after the
daemon restarts or the connection drops.
"""
import json
import os
import time

import grpc
from google.protobuf import json_format, text_format

from tandem_client._stubs import job_pb2, profile_pb2, tandem_service_pb2, tandem_service_pb2_grpc

TERMINAL_STATES = frozenset([job_pb2.JOB_STATE_SUCCEEDED, job_pb2.JOB_STATE_FAILED,
                             job_pb2.JOB_STATE_CANCELLED])

# Stream errors after which watch() resumes (see TandemClient.watch).
_WATCH_RETRY_CODES = frozenset([grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED])


class TandemError(Exception):
    """A Tandem RPC failed. `code` is the grpc.StatusCode, `message` the server's
    details (e.g. "training.batch_size: must be in [1, 65536], got 0"), `method`
    the RPC."""

    def __init__(self, method, code, message):
        super().__init__("%s: %s: %s" % (method, code.name, message))
        self.method = method
        self.code = code
        self.message = message

    @classmethod
    def from_rpc_error(cls, method, error):
        return cls(method, error.code(), error.details() or "")


# The CLI's limit too (clients/cli/rpc_client.cc): a page of jobs carries their
# plans and timelines, past gRPC's default 4 MiB.
_CHANNEL_OPTIONS = [("grpc.max_receive_message_length", 64 << 20)]
# A watch stream open this long before it broke had reached the daemon.
_WATCH_CONTACT_SECONDS = 2.0


def _read_structured_file(path, message):
    """Parses a YAML, JSON or protobuf text file into `message` (protobuf JSON
    mapping: snake_case or camelCase names, enums by name)."""
    path = os.fspath(path)
    with open(path) as f:
        text = f.read()
    if path.endswith((".textproto", ".pbtxt", ".txtpb")):
        return text_format.Parse(text, message)
    if path.endswith(".json") or text.lstrip().startswith("{"):
        data = json.loads(text)
    else:
        import yaml  # Debian's python3-yaml; only YAML files need it.
        data = yaml.safe_load(text)
    if not isinstance(data, dict):
        raise ValueError("%s: expected a mapping of %s fields" % (path, message.DESCRIPTOR.name))
    try:
        return json_format.ParseDict(data, message)
    except json_format.ParseError as e:
        raise ValueError("%s: %s" % (path, e)) from e


def _to_message(value, message_type, what):
    """A message of `message_type` from itself, a dict, or a file path."""
    if isinstance(value, message_type):
        copy = message_type()
        copy.CopyFrom(value)
        return copy
    if isinstance(value, dict):
        try:
            return json_format.ParseDict(value, message_type())
        except json_format.ParseError as e:
            raise ValueError("%s: %s" % (what, e)) from e
    if isinstance(value, (str, os.PathLike)):
        return _read_structured_file(value, message_type())
    raise TypeError("%s must be a %s, a dict or a file path, not %s" % (
        what, message_type.DESCRIPTOR.full_name, type(value).__name__))


def load_job_spec(spec):
    """A tandem.v1.JobSpec from a JobSpec, a dict, or a YAML/JSON job file."""
    return _to_message(spec, job_pb2.JobSpec, "spec")


def _state_value(state):
    if isinstance(state, int):
        return state
    name = str(state).upper()
    return job_pb2.JobState.Value(name if name.startswith("JOB_STATE_") else "JOB_STATE_" + name)


class TandemClient:
    """A connection to one tandemd. Thread-safe (gRPC channels are)."""

    def __init__(self, address="127.0.0.1:50051", token=None, tls_root_cert=None,
                 timeout_seconds=30.0, plan_timeout_seconds=300.0):
        """address: host:port of tandemd's --listen. token: the bearer token of a
        daemon started with --auth_token_file. tls_root_cert: PEM bytes, or a path
        to them, of the CA that signed the daemon's --tls_cert; None = plaintext.
        timeout_seconds: deadline of every unary call but PlanModel, which solves
        and gets plan_timeout_seconds."""
        if tls_root_cert is not None:
            if isinstance(tls_root_cert, (str, os.PathLike)):
                with open(tls_root_cert, "rb") as f:
                    tls_root_cert = f.read()
            credentials = grpc.ssl_channel_credentials(root_certificates=tls_root_cert)
            self._channel = grpc.secure_channel(address, credentials, options=_CHANNEL_OPTIONS)
        else:
            self._channel = grpc.insecure_channel(address, options=_CHANNEL_OPTIONS)
        self._stub = tandem_service_pb2_grpc.TandemStub(self._channel)
        self._metadata = (("authorization", "Bearer " + token),) if token else ()
        self.address = address
        self.timeout_seconds = timeout_seconds
        self.plan_timeout_seconds = plan_timeout_seconds

    def close(self):
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _call(self, method, request, timeout=None):
        try:
            return getattr(self._stub, method)(
                request, timeout=timeout if timeout is not None else self.timeout_seconds,
                metadata=self._metadata)
        except grpc.RpcError as e:
            raise TandemError.from_rpc_error(method, e) from None

    # ------------------------------------------------------------------ jobs

    def submit(self, spec, request_id=None, timeout=None):
        """Submits a job and returns its tandem.v1.Job (durable once this returns).
        spec: a JobSpec, a dict in the protobuf JSON mapping, or a YAML/JSON job
        file. request_id: an idempotency key; submitting the same key and spec
        again returns the original job."""
        request = tandem_service_pb2.SubmitJobRequest(spec=load_job_spec(spec),
                                                      request_id=request_id or "")
        return self._call("SubmitJob", request, timeout).job

    def get(self, job_id, timeout=None):
        return self._call("GetJob", tandem_service_pb2.GetJobRequest(job_id=job_id), timeout)

    def list(self, states=(), labels=None, limit=None, page_size=100, timeout=None):
        """Jobs, newest first, across pages. states: JobState values or names
        ("RUNNING" or "JOB_STATE_RUNNING"); labels: jobs carrying all of these."""
        request = tandem_service_pb2.ListJobsRequest(
            states=[_state_value(s) for s in states], labels=labels or {}, page_size=page_size)
        jobs = []
        while True:
            page = self._call("ListJobs", request, timeout)
            jobs.extend(page.jobs)
            if not page.next_page_token or (limit is not None and len(jobs) >= limit):
                return jobs[:limit] if limit is not None else jobs
            request.page_token = page.next_page_token

    def cancel(self, job_id, reason="", timeout=None):
        """Cancels a job (queued: at once; running: at its next step, after a
        checkpoint) and returns it. A finished job raises FAILED_PRECONDITION."""
        return self._call("CancelJob", tandem_service_pb2.CancelJobRequest(job_id=job_id, reason=reason),
                          timeout)

    def watch(self, job_id, callback, from_sequence=1, reconnect_timeout_seconds=120.0):
        """Calls callback(event) for each tandem.v1.JobEvent of the job, in order
        and without repeats, from `from_sequence` until the job ends; returns its
        final JobState (job_pb2.JobState.Name() gives the name).

        When the stream breaks it watches again from the next sequence, retrying
        with backoff for up to reconnect_timeout_seconds from the break (a job
        that was quiet for longer before it is still followed). Breaks
        are UNAVAILABLE (the daemon drains or restarts, the network drops) and
        CANCELLED, which this client never causes while it watches: a daemon
        that shuts down cancels the streams opened during its drain. Other
        errors raise TandemError; an exception from the callback propagates."""
        next_sequence = max(1, int(from_sequence))
        backoff = 0.1
        lost_since = None  # when the stream broke; None while it is whole
        while True:
            attempt = time.monotonic()
            call = self._stub.WatchJob(
                tandem_service_pb2.WatchJobRequest(job_id=job_id, from_sequence=next_sequence),
                metadata=self._metadata)
            try:
                for event in call:
                    lost_since = None
                    backoff = 0.1
                    if event.sequence < next_sequence:
                        continue
                    next_sequence = event.sequence + 1
                    callback(event)
                    if event.HasField("state_change") and event.state_change.to in TERMINAL_STATES:
                        call.cancel()
                        return event.state_change.to
                # The stream ended cleanly without a terminal event: the job was
                # already over before from_sequence, or the server let go early.
                job = self.get(job_id)
                if job.state in TERMINAL_STATES and job.last_event_sequence < next_sequence:
                    return job.state
            except grpc.RpcError as e:
                if e.code() not in _WATCH_RETRY_CODES:
                    raise TandemError.from_rpc_error("WatchJob", e) from None
                # A stream that stayed open (a quiet job) was contact, though
                # no event came: a daemon that is down fails at once.
                if lost_since is None or time.monotonic() - attempt > _WATCH_CONTACT_SECONDS:
                    lost_since = time.monotonic()
                elif time.monotonic() - lost_since > reconnect_timeout_seconds:
                    raise TandemError.from_rpc_error("WatchJob", e) from None
            except BaseException:
                call.cancel()
                raise
            time.sleep(backoff)
            backoff = min(backoff * 2, 5.0)

    # ---------------------------------------------------------- planning, node

    def plan(self, spec, hardware=None, profile=None, accelerator_memory_bytes=0,
             host_memory_bytes=0, compare=(), timeout=None):
        """Solves a plan for the spec's model and returns the PlanModelResponse
        (the plan for spec.placement.strategy, and the alternatives). Plans
        against `hardware` (a HardwareSpec, dict, or YAML/JSON/textproto file such
        as planner/hardware/h100_sxm_node.textproto), or a measured `profile`, or
        else the node's own profile. Budgets in bytes; 0 = the spec's or node's."""
        if hardware is not None and profile is not None:
            raise ValueError("plan: give hardware or profile, not both")
        request = tandem_service_pb2.PlanModelRequest(
            spec=load_job_spec(spec), accelerator_memory_bytes=accelerator_memory_bytes,
            host_memory_bytes=host_memory_bytes, compare=list(compare))
        if hardware is not None:
            request.hardware.CopyFrom(_to_message(hardware, profile_pb2.HardwareSpec, "hardware"))
        if profile is not None:
            request.profile.CopyFrom(_to_message(profile, profile_pb2.Profile, "profile"))
        return self._call("PlanModel", request,
                          timeout if timeout is not None else self.plan_timeout_seconds)

    def node(self, timeout=None, *, refresh_profile=False):
        """The daemon's tandem.v1.NodeInfo: devices, memory, jobs by state, node profile.

        refresh_profile: measure the node profile again first (refused with
        FAILED_PRECONDITION while jobs run)."""
        return self._call("GetNode",
                          tandem_service_pb2.GetNodeRequest(refresh_profile=refresh_profile),
                          timeout)
