"""Storage and formats: the one URI storage interface (local, gs://, s3://), URIs and file
hashes, credentials, streamed reading and the CSV/TSV/JSON Lines readers, TFRecord framing and
date placeholders in URIs. Nothing here imports tasks.config or any package above it."""
