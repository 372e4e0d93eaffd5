"""``python -m trainfit`` runs the command line."""
from trainfit.cli import main

main()
