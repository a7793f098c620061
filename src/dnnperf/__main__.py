import sys

from dnnperf.cli import main

sys.exit(main())
