"""`python -m hydraplan.api.cli ...`: the `hydraplan` command line."""

import sys

from hydraplan.api.cli import main

if __name__ == "__main__":  # importing this module (e.g. walking the package) runs nothing
    sys.exit(main())
