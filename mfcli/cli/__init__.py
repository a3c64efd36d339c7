"""The mfcli command line: thin Typer modules that parse options, call the library and render."""
