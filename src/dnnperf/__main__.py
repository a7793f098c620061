from dnnperf.cli import main
from dnnperf.interrupts import exit_now

exit_now(main())
