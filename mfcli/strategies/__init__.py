"""Layer 4 of docs/architecture.md: the kinds of strategy and the one Mechanism protocol they implement
(baselines, banded Toeplitz, BLT, dense and compressed operators).
"""
