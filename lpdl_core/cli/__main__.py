"""`python -m lpdl_core.cli`: the same as `lpdl`."""
import sys

from .entry import main

sys.exit(main())
