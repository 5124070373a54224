from specmac.cli import main

main(prog_name="specmac")
