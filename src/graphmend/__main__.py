"""``python -m graphmend``."""

import sys

from graphmend.cli import main
from graphmend.runner import debugged

status = main()
# Under python -i the prompt follows, as after python -i script.py; pdb restarts a
# program that ends well.
if not sys.flags.inspect and (status or not debugged()):
    raise SystemExit(status)
