"""Graph import: every model format into one IR, a weightless ONNX graph with concrete shapes.

`importer.load_graph` is the entry point. Front ends: ONNX (`onnx_import`), the webnn-graph text
(`webnn_text`) and JSON (`webnn_json`) formats and the Python `builder`, the three WebNN ones lowered to
ONNX by `webnn_ops`; then `shapes` binds the inputs and infers every tensor's shape, within `limits`.
"""
