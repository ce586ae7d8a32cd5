"""Training internals: topology -> strategy, the model and optimizer, input pipelines,
checkpoint loading, and the CPU kernels with the layers that use them."""
