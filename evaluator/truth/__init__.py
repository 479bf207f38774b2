"""The host's truth, out of every candidate's reach: seeded inputs, reference outputs and
reference costs for a task's cases (reference), XLA's compiled cost of the reference for a TPU
generation (xla_reference), and whether an output matches the reference within the task's
tolerance (compare).

May import: evaluator.analysis, evaluator.execution, evaluator.performance.
"""
