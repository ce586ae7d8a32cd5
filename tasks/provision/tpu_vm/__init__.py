"""`provisioner: tpu_vm`: Cloud TPU VMs from queued resources, and the agent that runs steps on them."""
