"""Reads the device: sysfs signals, psutil, NVML and onnxruntime micro-benchmarks.

Knows nothing about graphs or MQTT.
"""
