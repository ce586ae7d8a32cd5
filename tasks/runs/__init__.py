"""Run bookkeeping: the run folder layout, manifests, run config/context, and the run summary
the plugin shows."""
