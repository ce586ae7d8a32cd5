"""The embedded default backend: worker processes on this machine, and the warm-start server that forks them."""
