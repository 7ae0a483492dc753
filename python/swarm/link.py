"""The trainer side of the Swarm trainer link (proto/trainer_link.proto)."""
from __future__ import annotations

import os
import threading
import time
from typing import (Callable, Dict, Iterator, List, Mapping, Optional, Union)

import grpc
import numpy as np

from . import safetensors
from .errors import (AttachRefused, LinkError, ResultRejected, TaskCancelled,
                     TensorMismatch)
from ._proto import swarm_pb2, trainer_link_pb2 as pb, trainer_link_pb2_grpc

PROTOCOL_VERSION = pb.TRAINER_LINK_VERSION_CURRENT
SOCKET_ENV = "SWARM_TRAINER_SOCKET"

Tensors = Mapping[str, safetensors.TensorValue]
InitialModel = Union[Tensors, Callable[[], Tensors]]


def _error(err: grpc.RpcError, what: str) -> Exception:
    code = err.code()
    message = f"{what}: {err.details()}"
    if code in (grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED):
        return TaskCancelled(message)
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return ResultRejected(message)
    if code in (grpc.StatusCode.ALREADY_EXISTS,
                grpc.StatusCode.FAILED_PRECONDITION) and what == "attach":
        return AttachRefused(message)
    if code == grpc.StatusCode.UNAVAILABLE:
        return LinkError(f"{what}: the site's daemon is not reachable "
                         f"({err.details()})")
    return LinkError(message)


class TensorDict(dict):
    """Tensor name -> NumPy array, with `dtypes` (name -> safetensors dtype,
    e.g. "BF16" for raw uint16 arrays)."""

    def __init__(self, arrays: Mapping[str, np.ndarray],
                 dtypes: Mapping[str, str]):
        super().__init__(arrays)
        self.dtypes = dict(dtypes)


def _privacy_cost(privacy) -> Optional[swarm_pb2.PrivacyCost]:
    """A PrivacyCost message from a tuple, a mapping or None."""
    if privacy is None:
        return None
    if isinstance(privacy, Mapping):
        q, sigma, steps = (privacy["sampling_rate"],
                           privacy["noise_multiplier"], privacy["steps"])
    else:
        q, sigma, steps = privacy
    if not 0 < float(q) <= 1 or not float(sigma) > 0 or int(steps) < 1:
        raise ResultRejected(
            f"privacy cost (sampling_rate={q}, noise_multiplier={sigma}, "
            f"steps={steps}): the rate must be in (0, 1], the noise > 0 and "
            f"the steps >= 1")
    return swarm_pb2.PrivacyCost(sampling_rate=float(q),
                                 noise_multiplier=float(sigma),
                                 steps=int(steps))


class Task:
    """One unit of work from the site.

    kind: "train" (validate `model`, train from it, `submit`) or "initial"
    (the starting site asks for the first round's model: `submit` it).
    model: tensor name -> read-only NumPy array mapped from the daemon's file
    (no copy); BF16 tensors come as raw uint16 (see `dtypes`).
    """

    def __init__(self, site: "Site", proto: pb.TrainerTask):
        self._site = site
        self._proto = proto
        self.task_id: int = proto.task_id
        self.kind: str = ("initial" if proto.kind ==
                          pb.TRAINER_TASK_INITIAL_MODEL else "train")
        self.job_id: str = proto.job_id
        self.round: int = proto.round
        self.site_name: str = proto.site
        self.params: Dict[str, str] = dict(proto.params)
        self.want_validation: bool = proto.want_validation
        self.metric_names: List[str] = list(proto.metric_names)
        self.deadline_unix_ms: int = proto.deadline_unix_ms
        # The job requires differential privacy: submit(..., privacy=...).
        self.require_dp: bool = proto.require_dp
        self.dtypes: Dict[str, str] = {}
        self.model: Optional[TensorDict] = None
        self.done = False
        if proto.model_path:
            arrays, self.dtypes, _ = safetensors.read(proto.model_path)
            self.model = TensorDict(arrays, self.dtypes)

    @property
    def cancelled(self) -> bool:
        """True once the daemon said this task is cancelled (heartbeat)."""
        return self._site._is_cancelled(self.task_id)

    def report_validation(self, metrics: Mapping[str, float]) -> None:
        """Sends the metrics of the incoming global model on local validation
        data (e.g. {"accuracy": 0.91}). The job ranks models by them."""
        request = pb.ValidationRequest(
            session_id=self._site._session, task_id=self.task_id,
            metrics={k: float(v) for k, v in metrics.items()})
        self._site._call("report validation", self._site._stub.ReportValidation,
                         request)

    def submit(self, tensors: Tensors, num_samples: int,
               metrics: Optional[Mapping[str, float]] = None,
               diff: bool = False, check: bool = True,
               privacy=None) -> None:
        """Sends the trained weights (or, with diff=True, weights minus the
        task's model). `num_samples` is the FedAvg weight (> 0).

        `privacy`: the DP-SGD cost of this training, (sampling_rate,
        noise_multiplier, steps) as a tuple, a mapping or swarm.dp's
        PrivacyCost; the site charges it to its accountant. Required when
        `require_dp` (the site refuses the result otherwise).

        With check=True the tensor table is compared with the task's first
        (TensorMismatch names the tensor). Raises ResultRejected when the site
        refuses the result, TaskCancelled when the task was cancelled."""
        if self.done:
            raise TaskCancelled(f"task {self.task_id}: already submitted")
        if check and self.kind == "train":
            self._check(tensors)
        if check and self.kind == "train" and num_samples <= 0:
            raise ResultRejected(
                f"num_samples is {num_samples}: it must be > 0")
        cost = _privacy_cost(privacy)
        if check and self.kind == "train" and self.require_dp and cost is None:
            raise ResultRejected(
                "the job requires differential privacy: pass privacy="
                "(sampling_rate, noise_multiplier, steps) to submit")
        safetensors.write(self._proto.result_path, tensors, self.dtypes)
        request = pb.SubmitResultRequest(
            session_id=self._site._session, task_id=self.task_id,
            sample_count=max(0, int(num_samples)),
            metrics={k: float(v) for k, v in (metrics or {}).items()},
            payload_kind=(swarm_pb2.PAYLOAD_KIND_WEIGHT_DIFF if diff else
                          swarm_pb2.PAYLOAD_KIND_FULL_WEIGHTS))
        if cost is not None:
            request.privacy.CopyFrom(cost)
        self.done = True
        self._site._call("submit", self._site._stub.SubmitResult, request)

    def fail(self, reason: str) -> None:
        """Tells the site this task cannot be done (the round is reported
        failed on the site with `reason`)."""
        if self.done:
            return
        self.done = True
        request = pb.SubmitResultRequest(session_id=self._site._session,
                                         task_id=self.task_id,
                                         failure=reason or "failed")
        self._site._call("fail", self._site._stub.SubmitResult, request)

    def _check(self, tensors: Tensors) -> None:
        assert self.model is not None
        for name in tensors:
            if name not in self.model:
                raise TensorMismatch(
                    f"tensor {name!r}: not in the task's model", name)
        for name, want in self.model.items():
            if name not in tensors:
                raise TensorMismatch(
                    f"tensor {name!r}: missing from the result", name)
            got = tensors[name]
            shape = tuple(got.shape)
            if shape != tuple(want.shape):
                raise TensorMismatch(
                    f"tensor {name!r}: shape {list(shape)}, the task's model "
                    f"has {list(want.shape)}", name)
            dtype = (got.dtype if isinstance(got, safetensors.Raw)
                     else safetensors.dtype_of(got))
            expected = self.dtypes[name]
            raw_ok = (not isinstance(got, safetensors.Raw) and
                      safetensors._NUMPY[expected] == np.asarray(got).dtype)
            if dtype != expected and not raw_ok:
                raise TensorMismatch(
                    f"tensor {name!r}: dtype {dtype}, the task's model has "
                    f"{expected}", name)


class Site:
    """A session with one site's daemon. Use `connect()`."""

    def __init__(self, socket: str, name: str, job: str,
                 initial_model: Optional[InitialModel], timeout: float):
        self.socket = socket
        self._initial_model = initial_model
        self._channel = grpc.insecure_channel(f"unix:{socket}")
        self._stub = trainer_link_pb2_grpc.TrainerLinkStub(self._channel)
        self._timeout = timeout
        self._lock = threading.Lock()
        self._cancelled: set = set()
        self._closed = threading.Event()
        self._lost: Optional[Exception] = None
        try:
            grpc.channel_ready_future(self._channel).result(timeout=timeout)
        except grpc.FutureTimeoutError:
            self._channel.close()
            raise LinkError(f"no Swarm daemon answers on {socket} "
                            f"within {timeout} s")
        request = pb.AttachRequest(protocol_version=PROTOCOL_VERSION,
                                   trainer_name=name, pid=os.getpid(),
                                   job_id=job)
        # Another trainer holds the site (e.g. this trainer's previous run,
        # killed, whose lease has not run out yet): wait up to `timeout`.
        deadline = time.monotonic() + timeout
        while True:
            try:
                reply = self._stub.Attach(request, timeout=timeout)
                break
            except grpc.RpcError as err:
                if err.code() == grpc.StatusCode.ALREADY_EXISTS and \
                        time.monotonic() < deadline:
                    time.sleep(0.1)
                    continue
                self._channel.close()
                raise _error(err, "attach") from None
        self._session: str = reply.session_id
        self.site: str = reply.site
        self.job_id: str = reply.job_id
        self.lease_s: float = reply.lease_ms / 1000.0
        self._heartbeat = threading.Thread(target=self._beat, daemon=True,
                                           name="swarm-heartbeat")
        self._heartbeat.start()

    # -- public -------------------------------------------------------------
    def tasks(self) -> Iterator[Task]:
        """Yields tasks until the job this trainer works for ends (or the
        daemon shuts down). A task left without submit() or fail() is failed
        when the loop moves on."""
        while not self._closed.is_set():
            if self._lost is not None:
                raise self._lost
            request = pb.NextTaskRequest(session_id=self._session,
                                         wait_ms=int(self.lease_s * 500))
            try:
                reply = self._stub.NextTask(request,
                                            timeout=self.lease_s + 30)
            except grpc.RpcError as err:
                if err.code() == grpc.StatusCode.UNAVAILABLE and \
                        "shutting down" in (err.details() or ""):
                    return
                raise _error(err, "next task") from None
            proto = reply.task
            if proto.kind == pb.TRAINER_TASK_NONE:
                continue
            if proto.kind == pb.TRAINER_TASK_JOB_END:
                return
            task = Task(self, proto)
            if task.kind == "initial" and self._initial_model is not None:
                model = self._initial_model
                tensors = model() if callable(model) else model
                task.submit(tensors, num_samples=1)
                continue
            yield task
            if not task.done:
                try:
                    task.fail("the trainer's loop moved on without submitting")
                except (TaskCancelled, LinkError):
                    pass

    def close(self) -> None:
        """Detaches (the site may take another trainer at once)."""
        if self._closed.is_set():
            return
        self._closed.set()
        try:
            self._stub.Detach(pb.DetachRequest(session_id=self._session),
                              timeout=5)
        except grpc.RpcError:
            pass
        self._channel.close()

    def __enter__(self) -> "Site":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- internals ----------------------------------------------------------
    def _call(self, what: str, method, request):
        try:
            return method(request, timeout=self._timeout + 60)
        except grpc.RpcError as err:
            raise _error(err, what) from None

    def _is_cancelled(self, task_id: int) -> bool:
        with self._lock:
            return task_id in self._cancelled

    def _beat(self) -> None:
        interval = max(self.lease_s / 3.0, 0.05)
        while not self._closed.wait(interval):
            try:
                reply = self._stub.Heartbeat(
                    pb.HeartbeatRequest(session_id=self._session),
                    timeout=max(self.lease_s, 1.0))
            except grpc.RpcError as err:
                if self._closed.is_set():
                    return
                if err.code() == grpc.StatusCode.NOT_FOUND:
                    self._lost = LinkError(f"session lost: {err.details()}")
                    return
                continue
            with self._lock:
                self._cancelled.update(reply.cancelled_task_ids)


def connect(socket: Optional[str] = None, name: Optional[str] = None,
            job: str = "", initial_model: Optional[InitialModel] = None,
            timeout: float = 30.0) -> Site:
    """Attaches to this site's daemon.

    socket: the link's Unix socket; default $SWARM_TRAINER_SOCKET (set by the
    daemon in launch mode). job: refuse to work for another job (default
    $SWARM_JOB_ID or any). initial_model: the first round's weights (a mapping
    or a callable returning one) for when this site starts the job.
    While another trainer is attached (for instance this script's previous
    run, killed, until its lease runs out) it retries for `timeout` seconds.
    Raises LinkError (no daemon) or AttachRefused (another trainer still
    attached after `timeout`, protocol version mismatch, other job)."""
    socket = socket or os.environ.get(SOCKET_ENV)
    if not socket:
        raise LinkError(f"no socket given and ${SOCKET_ENV} is not set")
    name = name or os.path.basename(os.path.splitext(
        os.path.abspath(os.sys.argv[0] or "trainer"))[0])
    job = job or os.environ.get("SWARM_JOB_ID", "")
    return Site(socket, name, job, initial_model, timeout)
