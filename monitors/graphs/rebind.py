"""Input descriptors that resize a WebNN graph: built at one size, asked about another.

A web app builds its graph once (say at 224x224) and asks about the size it will run (720x1280). A WebNN
graph is lowered again with the input declared at the new size, so that every size the lowering derives
from it (padding, reshape targets, normalised axes) follows, as rebuilding the graph at that size would.
Where the graph cannot take the new size, the error is the bindings' (`bad_inputs`), naming the node.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from monitors.graphs.graph import Graph, InputSpec
from monitors.graphs.limits import Limits
from monitors.graphs.shapes import bind_and_infer, blame_bindings
from monitors.graphs.webnn_ops import GraphDecl, lower


def resized(graph: GraphDecl, inputs: Mapping[str, InputSpec]) -> tuple[GraphDecl, dict[str, InputSpec]]:
    """The declaration with each input a binding gives other fixed sizes declared at those sizes, and for each
    such input the binding that keeps the graph as built; `graph` itself where no binding resizes it."""
    as_built: dict[str, InputSpec] = {}
    decls = []
    for inp in graph.inputs:
        spec = inputs.get(inp.name)
        if spec is None or len(spec.shape) != len(inp.dims) or all(
                not isinstance(d, int) or d == s for d, s in zip(inp.dims, spec.shape, strict=True)):
            decls.append(inp)
            continue
        pairs = list(zip(inp.dims, spec.shape, strict=True))
        as_built[inp.name] = InputSpec(tuple(d if isinstance(d, int) else s for d, s in pairs), spec.dtype)
        decls.append(dataclasses.replace(inp, dims=[s if isinstance(d, int) else d for d, s in pairs]))
    if not as_built:
        return graph, {}
    return dataclasses.replace(graph, inputs=decls), as_built


def lower_and_bind(graph: GraphDecl, inputs: Mapping[str, InputSpec] | None, limits: Limits, name: str) -> Graph:
    """The estimator's Graph of a WebNN declaration, at the sizes the bindings give."""
    inputs = inputs or {}
    at_size, as_built = resized(graph, inputs)
    if not as_built:
        return bind_and_infer(lower(graph, limits), inputs, limits, name)
    return blame_bindings(lambda: bind_and_infer(lower(at_size, limits), inputs, limits, name),
                          lambda: bind_and_infer(lower(graph, limits), {**inputs, **as_built}, limits, name),
                          inputs, as_built)
