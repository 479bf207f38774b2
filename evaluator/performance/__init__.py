"""The static performance model: TPU generations, their VMEM budgets and published figures
(hardware), a kernel's estimated time at bench sizes beside an ideal kernel's (perf_model), XLA's
own TPU cost model read from a compile and priced with its pitfalls handled (xla_cost), the
predicted speedup over XLA (prediction), its calibrated constants (calibration) and their fit to
measured times (fit). Estimates, not measurements: docs/performance-model.md.

May import: evaluator.candidate, evaluator.analysis.
"""
