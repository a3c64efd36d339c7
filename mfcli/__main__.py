from mfcli.cli.entry import main

main()
