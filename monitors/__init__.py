"""Decides: weightless graphs -> kernel plan -> latency -> tier -> meetsRequirement.

Pure computation, no I/O beyond reading a model the caller names, so it can be
tested exhaustively and re-run for thousands of monitors per tick.
"""
