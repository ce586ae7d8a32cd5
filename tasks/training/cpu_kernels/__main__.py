import sys

from tasks.training.cpu_kernels import main

sys.exit(main(sys.argv))
