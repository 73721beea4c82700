"""``python -m quantdbg`` runs the CLI."""
import sys

from quantdbg.cli import main

sys.exit(main())
