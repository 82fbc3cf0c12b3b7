"""Choosing each round: the K policies, the adaptive controller and its cost model, calibration. Imports the layers
below (core, io, draft)."""
