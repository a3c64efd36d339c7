"""Layer 5 of docs/architecture.md: the one artifact reader and writer for every kind.
"""
