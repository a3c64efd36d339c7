"""The package version, in a leaf module: the artifact writer, the accounting records and the CLI
stamp it without importing the package's index of public names (``mfcli/__init__.py``), which
names modules of every layer (docs/architecture.md, "Layer table")."""

__version__ = "0.4.0"
