"""The host's truth, out of every candidate's reach: seeded inputs, reference outputs and
reference costs for a task's cases (reference), and whether an output matches the reference
within the task's tolerance (compare).

May import: evaluator.analysis, evaluator.execution.
"""
