"""What several benchmark scripts share: locations, timing, results files (common), the
training benchmarks' batches (trainbench_data) and random checkpoints (synthetic_inputs).
A package with this file, so that no other `lib` on the import path can stand in for it."""
