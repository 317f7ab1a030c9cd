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


class InputsError(GraphError):
    """Input bindings the graph cannot take: a missing shape, a wrong rank or data type, a size it has no room for.

    A GraphError, so that whoever catches a graph's faults catches these too; its own code tells the caller that
    the fix is in the bindings (`inputs`, `--input`, `inputDescriptors`), not in the graph.
    """

    code = "bad_inputs"


class UnboundInput(InputsError):
    """An input whose shape neither the graph nor the caller gives. The message says it for every surface;
    `cli_hint` is the command line's way to give it (the CLI adds it), kept through a worker process's pickle."""

    def __init__(self, message: str, code: str | None = None, cli_hint: str = "") -> None:
        super().__init__(message, code)
        self.cli_hint = cli_hint

    def __reduce__(self) -> tuple[type, tuple[str, str, str]]:  # type: ignore[override]
        return (type(self), (str(self), self.code, self.cli_hint))
