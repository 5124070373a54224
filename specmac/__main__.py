from specmac.cli import main

main()
