import sys

from tasks.model.cpu_kernels import main

sys.exit(main(sys.argv))
