from ckpt.cli import main

main(prog_name="ckpt")
