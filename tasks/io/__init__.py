"""Storage and formats: the one URI storage interface (local, gs://, s3://), credentials,
streamed reading of delimited text, TFRecord framing and date placeholders in URIs."""
