"""Benchmarks that print figures: accuracy of the estimator against real onnxruntime runs."""
