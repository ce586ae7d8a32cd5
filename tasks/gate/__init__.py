"""The quality gate's evaluation: both models scored on the same test units, and the
paired bootstrap of their difference (tasks/steps/gate_eval.py runs it, promote decides)."""
