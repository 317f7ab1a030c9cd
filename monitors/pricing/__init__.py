"""Pricing: a graph's kernel plan, priced from the calibration, and the tier of the result.

`planner` finds the kernels onnxruntime runs (`kernels`), `costmodel` prices each from the calibration's
tables (probes/calibration.py), `estimator` ties them together per device, `tiers` is the only measure of
speed that leaves the device.
"""
