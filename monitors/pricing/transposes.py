"""onnxruntime's transpose optimizer, as far as the plan needs it: Transposes pushed down through the ops that
do not care about layout, and cancelled where they meet their inverse.

A graph in channels-last layout (a WebNN graph built with `inputLayout: "nhwc"`, a TensorFlow export) reaches
ONNX as each convolution wrapped in a Transpose to NCHW before it and one back after it, with the activations,
resizes and concatenations between them in NHWC. onnxruntime's level-1 TransposeOptimizer (on by default)
pushes each Transpose forward through such ops until it meets the next one; inverse pairs vanish, and the
convolutions then chain in NCHW (and in the blocked NCHWc layout) with their activations fused. Priced as
written, the same graph costs a Transpose, a reorder and an unfused activation around every convolution:
1.6-1.8x its real time for the blur segmenter.

Pure: a new Graph for the planner, the caller's untouched. Only what the plan reads is kept right (ops, the
axis attributes it reads, shapes); the rewritten graph is not meant to run. Pushed through: unary
element-wise ops, binary ones whose other inputs are constants or Transposes of the same permutation,
Concat of such inputs (its axis remapped), Resize; a Transpose read by two such ops stays (pushed, it would
become two). Transposes of constants are left to constant folding.
"""

from __future__ import annotations

import copy
from collections import defaultdict, deque

import onnx

from monitors.graphs.graph import Graph, TensorInfo

UNARY = {
    "Relu", "Sigmoid", "Tanh", "Clip", "LeakyRelu", "HardSigmoid", "HardSwish", "Elu", "Selu", "Celu", "Gelu",
    "Erf", "Exp", "Log", "Neg", "Abs", "Sqrt", "Reciprocal", "Floor", "Ceil", "Round", "Sign", "Softplus",
    "Softsign", "Cast", "Identity", "Dropout", "Not", "IsNaN", "IsInf", "Sin", "Cos", "QuickGelu", "Mish",
    "Resize", "Upsample",
}
BINARY = {"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean", "Equal", "Less", "Greater",
          "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor", "PRelu", "Where", "Mod"}
SUFFIX = "__nt"  # a pushed-through op's output in the Transpose's input layout


def _perm(node: onnx.NodeProto, rank: int) -> tuple[int, ...]:
    for a in node.attribute:
        if a.name == "perm":
            return tuple(a.ints)
    return tuple(reversed(range(rank)))


RESIZES = {"Resize", "Upsample"}


def push_transposes(graph: Graph, folded: frozenset[str], through_resize: bool = True) -> Graph:
    """`graph` with its Transposes pushed down and cancelled as onnxruntime does; the graph itself where there is
    nothing to push. `folded`: the tensors onnxruntime folds (a Transpose of one is folded, not pushed).
    `through_resize`: False for onnxruntime's CUDA builds, whose Resize takes NCHW only (the optimizer leaves a
    Transpose before it)."""
    if not any(n.op_type == "Transpose" and n.input[0] not in folded for n in graph.nodes):
        return graph
    return _Pusher(graph, folded, through_resize).run()


class _Pusher:
    def __init__(self, graph: Graph, folded: frozenset[str], through_resize: bool = True) -> None:
        self.graph = graph
        self.folded = folded
        self.unary = UNARY if through_resize else UNARY - RESIZES
        originals = [copy.deepcopy(n) for n in graph.nodes]
        self.nodes: list[onnx.NodeProto | None] = list(originals)
        self.tensors = dict(graph.tensors)
        self.static = None if graph.static is None else set(graph.static)
        self.outputs = {o.name for o in graph.model.graph.output}
        self.producer: dict[str, int] = {}
        self.consumers: dict[str, list[int]] = defaultdict(list)
        self.after: dict[int, list[int]] = defaultdict(list)  # new Transposes to place after node i
        self.retry: list[int] = []  # Transposes that lost a reader
        for i, n in enumerate(originals):
            self._link(i, n)

    def _link(self, i: int, n: onnx.NodeProto) -> None:
        for o in n.output:
            if o:
                self.producer[o] = i
        for t in n.input:
            if t:
                self.consumers[t].append(i)

    def _source(self, tensor: str) -> tuple[str, tuple[int, ...]] | None:
        """(input, perm) of the live, pushable Transpose that makes `tensor`."""
        i = self.producer.get(tensor)
        n = None if i is None else self.nodes[i]
        if n is None or n.op_type != "Transpose" or n.input[0] in self.folded:
            return None
        return n.input[0], _perm(n, len(self.tensors[n.input[0]].shape))

    def run(self) -> Graph:
        queue = deque(i for i, n in enumerate(self.nodes) if n is not None and n.op_type == "Transpose")
        while queue:
            i = queue.popleft()
            n = self.nodes[i]
            if n is not None and self._source(n.output[0]) is not None:
                queue += self._push(i)
            queue += self.retry
            self.retry.clear()
        order: list[onnx.NodeProto] = []
        for i, n in enumerate(self.nodes):
            if n is not None and i < len(self.graph.nodes):
                order.append(n)
                self._place_after(i, order)
        model = onnx.ModelProto()
        model.CopyFrom(self.graph.model)
        del model.graph.node[:]
        model.graph.node.extend(order)
        return Graph(model, self.tensors, self.graph.constants, self.graph.name,
                     None if self.static is None else frozenset(self.static))

    def _place_after(self, i: int, order: list[onnx.NodeProto]) -> None:
        for j in self.after.get(i, []):
            n = self.nodes[j]
            if n is not None:
                order.append(n)
            self._place_after(j, order)

    def _push(self, t: int) -> list[int]:
        """Push Transpose `t` into all its consumers, or leave it; the new Transposes made."""
        node = self.nodes[t]
        assert node is not None
        y = node.output[0]
        perm = _perm(node, len(self.tensors[node.input[0]].shape))
        users = sorted(set(self.consumers.get(y, [])))
        others = [u for u in users if (n := self.nodes[u]) is not None and n.op_type != "Transpose"]
        if len(others) > 1:
            return []  # pushed into two ops, one Transpose would become two
        if not users or y in self.outputs or not all(self._takes(u, y, perm) for u in users):
            return []
        made: list[int] = []
        for u in users:
            made += self._absorb(u, perm)
        return made

    def _takes(self, u: int, y: str, perm: tuple[int, ...]) -> bool:
        """Whether node `u` can take the Transpose's input in place of `y`."""
        n = self.nodes[u]
        if n is None:
            return False
        if n.op_type == "Transpose":
            return True
        if n.domain not in ("", "ai.onnx") or any(o in self.outputs for o in n.output):
            return False  # a graph output's layout is the model's: a Transpose would stay after it
        rank = len(perm)
        if n.op_type in self.unary:
            return len(self.tensors[n.output[0]].shape) == rank
        if n.op_type in BINARY or n.op_type == "Concat":
            return all(t == y or t in self.folded or self._same_transpose(t, perm) for t in n.input if t) \
                and len(self.tensors[n.output[0]].shape) == rank
        return False

    def _same_transpose(self, tensor: str, perm: tuple[int, ...]) -> bool:
        found = self._source(tensor)
        return found is not None and found[1] == perm and len(self.tensors[found[0]].shape) == len(perm)

    def _absorb(self, u: int, perm: tuple[int, ...]) -> list[int]:
        """Node `u` reads its Transposed inputs' sources; a Transpose after it gives its outputs back, or, for a
        Transpose, the two compose (and vanish when inverse)."""
        n = self.nodes[u]
        assert n is not None
        if n.op_type == "Transpose":
            found = self._source(n.input[0])
            assert found is not None
            composed = tuple(perm[q] for q in _perm(n, len(perm)))
            if composed != tuple(range(len(perm))):
                self._read_source(u, 0, found[0])
                _set_attr(n, "perm", list(composed))
                return [u]
            if n.output[0] not in self.outputs:  # inverse: both gone, its readers read the source
                self._drop_use(n.input[0], u)
                self.nodes[u] = None
                self._rename(n.output[0], found[0])
                return []
            n.op_type = "Identity"  # ... or, a graph output, a copy that onnxruntime does not make
            del n.attribute[:]
            self._read_source(u, 0, found[0])
            return []
        for k, t in enumerate(n.input):
            found = self._source(t) if t else None
            if found is not None and found[1] == perm:
                self._read_source(u, k, found[0])
        if n.op_type == "Concat":
            axis = next((a.i for a in n.attribute if a.name == "axis"), 0) % len(perm)
            _set_attr(n, "axis", perm[axis])
        made = []
        for k, out in enumerate(n.output):
            if not out:
                continue
            inner = out + SUFFIX
            info = self.tensors[out]
            shape = [0] * len(perm)
            for i, p in enumerate(perm):
                shape[p] = info.shape[i]
            self.tensors[inner] = TensorInfo(tuple(shape), info.dtype)
            if self.static is not None and out in self.static:
                self.static.add(inner)
            n.output[k] = inner
            self.producer[inner] = u
            back = onnx.helper.make_node("Transpose", [inner], [out], name=f"{n.name or out}{SUFFIX}",
                                         perm=list(perm))
            j = len(self.nodes)
            self.nodes.append(back)
            self.after[u].append(j)
            self.producer[out] = j
            self.consumers[inner].append(j)
            made.append(j)
        return made

    def _read_source(self, u: int, k: int, source: str) -> None:
        """Node `u`'s input `k` is now the source of the Transpose it read."""
        n = self.nodes[u]
        assert n is not None
        self._drop_use(n.input[k], u)
        n.input[k] = source
        self.consumers[source].append(u)

    def _drop_use(self, tensor: str, u: int) -> None:
        """Node `u` no longer reads `tensor`; a Transpose that made it and is read by no one else goes."""
        users = self.consumers.get(tensor, [])
        if u in users:
            users.remove(u)
        p = self.producer.get(tensor)
        n = None if p is None else self.nodes[p]
        if p is None or n is None or n.op_type != "Transpose":
            return
        if users or tensor in self.outputs:
            self.retry.append(p)  # with fewer readers it may go further now
        else:
            self.nodes[p] = None
            self._drop_use(n.input[0], p)

    def _rename(self, old: str, new: str) -> None:
        for u in self.consumers.pop(old, []):
            n = self.nodes[u]
            if n is None:
                continue
            for k, t in enumerate(n.input):
                if t == old:
                    n.input[k] = new
            self.consumers[new].append(u)


def _set_attr(node: onnx.NodeProto, name: str, value: int | list[int]) -> None:
    kept = [a for a in node.attribute if a.name != name]
    del node.attribute[:]
    node.attribute.extend([*kept, onnx.helper.make_attribute(name, value)])
