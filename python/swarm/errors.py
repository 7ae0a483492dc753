"""Exceptions of the Swarm trainer SDK."""


class SwarmError(Exception):
    """Base class of every error the SDK raises."""


class LinkError(SwarmError):
    """The trainer link failed: no daemon on the socket, the daemon went away,
    or the session expired."""


class AttachRefused(LinkError):
    """The daemon refused to attach this trainer: another trainer is attached,
    the protocol versions differ, or the site runs another job. The message
    says which (and names the versions or the job)."""


class TaskCancelled(SwarmError):
    """The task was cancelled by the daemon (the round moved on, a newer task
    superseded it, or its deadline passed). Stop working on it."""


class ResultRejected(SwarmError):
    """The daemon refused the result (the round is reported failed on the
    site). The message names the tensor and the rule broken."""


class TensorMismatch(ResultRejected):
    """The result's tensor table does not match the task's model (found by the
    SDK before sending). `tensor` names the offending tensor."""

    def __init__(self, message: str, tensor: str):
        super().__init__(message)
        self.tensor = tensor
