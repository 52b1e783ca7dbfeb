"""`python -m symkern ...`: see symkern.cli."""

import sys

from symkern.cli import main

sys.exit(main())
