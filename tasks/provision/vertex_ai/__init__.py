"""`provisioner: vertex_ai`: one Vertex AI CustomJob per worker step."""
