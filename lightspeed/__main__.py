"""``python -m lightspeed``: the same as the ``lightspeed`` command."""
import sys

from .cli import main

sys.exit(main())
