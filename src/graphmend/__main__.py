"""``python -m graphmend``."""

from graphmend.cli import main

raise SystemExit(main())
