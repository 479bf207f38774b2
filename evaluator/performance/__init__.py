"""The static performance model: TPU generations, their VMEM budgets and published figures
(hardware), and a kernel's estimated time at bench sizes beside an ideal kernel's (perf_model).
An estimate, not a measurement: docs/performance-model.md.

May import: evaluator.candidate, evaluator.analysis.
"""
