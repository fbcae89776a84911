"""``python -m agentsessions.host`` serves the host (same as ``agentsessions serve``)."""

import sys

from agentsessions.host.cli import main

sys.exit(main(["serve", *sys.argv[1:]]))
