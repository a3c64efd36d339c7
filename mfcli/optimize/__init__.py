"""Layer 3 of docs/architecture.md: the certified solvers for dense strategies (single and multiple
participation, BandMF in band storage) and their numerical kernels.
"""
