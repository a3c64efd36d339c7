"""Layer 0 of docs/architecture.md: the rules every layer shares (validation, memory limits, size
limits, progress events). Imports nothing else of mfcli.
"""
