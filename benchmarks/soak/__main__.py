import sys

from benchmarks.soak.run import main

sys.exit(main())
