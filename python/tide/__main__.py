"""`python -m tide ARGS` runs the tide program: `tide ARGS`."""
from ._cli import main

main()
