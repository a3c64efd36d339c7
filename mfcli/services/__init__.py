"""Layer 6 of docs/architecture.md: what the commands compute (account, records, inspect, compare,
compress, plan), numbers only: the library never renders.
"""
