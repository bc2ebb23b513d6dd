from toolfleet.cli.main import main

main()
