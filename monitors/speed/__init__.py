"""The present speed: how much slower than calibrated this device runs a model now."""
