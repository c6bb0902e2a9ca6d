#!/usr/bin/env python3
"""Regenerate docs/RESULTS.md (tables, the commands behind them, the machine, the figures).

    python scripts/make_results.py --quick   # a few minutes on a 2-core CPU
    python scripts/make_results.py           # the full set, about an hour
    python scripts/make_results.py --dry-run # print the plan

The same as `specdec results [...]`; every option of that command works here (see --help).
"""

import sys

from specdec.cli import main

if __name__ == "__main__":
    raise SystemExit(main(["results", *sys.argv[1:]]))
