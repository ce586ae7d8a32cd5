import sys

from tasks.cpu_kernels import main

sys.exit(main(sys.argv))
