"""Batch scoring with a model version (bert_batch_score): the plan, shard records and the
publication of a scoring run; the workers are tasks/steps/score.py (docs/scoring.md)."""
