import sys

# Absolute: huey's SIGHUP restart execs `python <this file> …` (sys.argv), where a relative
# import has no package to be relative to.
from hermes_bulk.frontends.cli import main

sys.exit(main())
