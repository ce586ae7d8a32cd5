"""`provisioner: kubernetes`: Indexed Jobs behind a headless Service, on any cluster."""
