"""`python -m pkgtrain`: the package's entry point runs the training loop."""

from .train import main

main()
