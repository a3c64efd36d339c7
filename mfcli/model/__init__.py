"""Layer 1 of docs/architecture.md: the problem being solved (participation schemas, workloads, the
factorization A = B C, the registry of strategy kinds, the artifact format's definitions).
"""
