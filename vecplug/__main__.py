from vecplug.cli import main

main()
