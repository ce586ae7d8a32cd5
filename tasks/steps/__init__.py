"""The pipeline steps: each module has `run(cfg, ctx) -> manifest URI` and is what
`python -m tasks <step>` runs (data, tokenize, train, evaluate, export, promote)."""
