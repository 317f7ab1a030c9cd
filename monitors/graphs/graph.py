"""The one graph type every importer produces: weightless ONNX with concrete shapes.

ONNX is the lingua franca because onnxruntime is the engine we speak for: a
WebNN graph is estimated as the ONNX graph a WebNN-on-onnxruntime backend
would run. Weights are descriptors only (dims and data type); their bytes are
never read. A stripped tensor is marked as external data at ABSENT_LOCATION.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # the agent's main process reads input specs and dtype names, never graphs: it does not load onnx
    import onnx

ABSENT_LOCATION = "daop:absent"

# ONNX TensorProto.DataType -> numpy-style dtype name. The codes are ONNX's (onnx.proto: stable, they are on disk),
# written out so that the agent's main process does not load onnx (tests/test_onnx_import.py checks them).
DTYPE_NAMES: dict[int, str] = {
    1: "float32",  # FLOAT
    2: "uint8",  # UINT8
    3: "int8",  # INT8
    4: "uint16",  # UINT16
    5: "int16",  # INT16
    6: "int32",  # INT32
    7: "int64",  # INT64
    9: "bool",  # BOOL
    10: "float16",  # FLOAT16
    11: "float64",  # DOUBLE
    12: "uint32",  # UINT32
    13: "uint64",  # UINT64
    16: "bfloat16",  # BFLOAT16
}
DTYPE_CODES: dict[str, int] = {name: code for code, name in DTYPE_NAMES.items()}
ITEMSIZE: dict[str, int] = {
    "float32": 4, "uint8": 1, "int8": 1, "uint16": 2, "int16": 2, "int32": 4, "int64": 8,
    "bool": 1, "float16": 2, "float64": 8, "uint32": 4, "uint64": 8, "bfloat16": 2,
}


@dataclass(frozen=True)
class TensorInfo:
    shape: tuple[int, ...]
    dtype: str  # a key of ITEMSIZE

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1

    @property
    def nbytes(self) -> int:
        return self.size * ITEMSIZE.get(self.dtype, 4)


@dataclass(frozen=True)
class InputSpec:
    """A caller's binding for a graph input: `--input NAME=1x3x224x224[:float32]`."""

    shape: tuple[int, ...]
    dtype: str | None = None


@dataclass
class Graph:
    """A weightless ONNX model whose every tensor has a concrete shape.

    `tensors` maps every tensor name (inputs, initializers, node outputs) to
    its shape and dtype; `constants` names the tensors whose values are known
    before inference once the inputs are bound (initializers and what only
    depends on them, including shapes).
    """

    model: onnx.ModelProto
    tensors: dict[str, TensorInfo]
    constants: frozenset[str] = field(default_factory=frozenset)
    name: str = ""
    # Tensors whose shape the model itself fixes, before the caller's --input bindings; None: all of
    # them. onnxruntime sees the model as declared: it folds Shape only of these and fuses some ops
    # (MatMul+Add of N-D products) only on static shapes.
    static: frozenset[str] | None = None

    def is_static(self, tensor: str) -> bool:
        return self.static is None or tensor in self.static

    @property
    def nodes(self):  # -> RepeatedCompositeContainer[onnx.NodeProto]
        return self.model.graph.node

    @property
    def weight_bytes(self) -> int:
        return sum(self.tensors[t.name].nbytes for t in self.model.graph.initializer if t.name in self.tensors)
