"""Errors that mean "bad input": the CLI exits 2 with one line, MQTT answers an error."""


class BadInput(ValueError):
    """Input the caller can fix: the message is one clear line, shown as is.

    `code` is the machine-readable error code used in MQTT error answers.
    """

    code = "bad_request"

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code

    def __reduce__(self) -> tuple[type, tuple[str, str]]:
        """Its code survives the trip back from a worker process (pickle would rebuild it from the message only)."""
        return (type(self), (str(self), self.code))


class GraphError(BadInput):
    """A model that cannot be read, is malformed, or exceeds the limits."""

    code = "bad_graph"


class LimitExceeded(GraphError):
    """A graph too large to be estimated safely (nodes, tensor sizes, total work)."""

    code = "limit_exceeded"
