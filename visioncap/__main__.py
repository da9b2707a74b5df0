from visioncap.cli import main

main()
