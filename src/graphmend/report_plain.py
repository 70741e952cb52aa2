"""``python -m graphmend.report_plain OUTPUT script.py [args...]``: the run ``report
--compare`` compares with, in a process of its own without GraphMend.

Internal, and no option of ``report``: it writes JSON into ``OUTPUT``, which a user
who typed it by accident would lose (``report`` started it as ``report
--without-graphmend OUTPUT``).
"""

from __future__ import annotations

import sys

from graphmend.cli import with_errors_reported
from graphmend.report_script import observe_without_graphmend


def main(arguments: list[str]) -> int:
    """Observe the script's calls as written, into the file ``arguments[0]`` names."""
    output, target, *args = arguments
    return with_errors_reported(lambda: observe_without_graphmend(target, args, output=output))


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
