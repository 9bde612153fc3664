"""python -m tfbigconv: the command line (tfbigconv.cli)."""
import sys

from tfbigconv.cli import main

sys.exit(main())
