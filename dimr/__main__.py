from dimr.cli import main

main()
