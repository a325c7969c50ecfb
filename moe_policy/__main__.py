"""``python -m moe_policy``: the ``moe-policy`` command line."""

import sys

from moe_policy.cli import main

sys.exit(main())
