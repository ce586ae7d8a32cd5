"""Worker provisioning: one worker spec (spec.py), many backends (backends.py), each in a
folder of its own (local/, kubernetes/, vertex_ai/, tpu_vm/); attempts, capacity, images,
launcher, preflight and worker logs are shared by the backends. The provision and release
steps that drive them are tasks/steps/provision.py and tasks/steps/release.py."""
