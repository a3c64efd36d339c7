from mfcli.cli.app import main

main()
