import sys

from lmsim.cli import main

sys.exit(main())
