import sys

from visioncap.bench.soak.run import main

sys.exit(main())
