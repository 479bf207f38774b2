"""Static analysis of traced programs: what a jaxpr does, read without running it.

The walkers (jaxpr_walk: nested jaxprs; jaxpr_cost: FLOPs, bytes, DMAs; intervals and
trip_origin: loop trip counts; grid_conds: which branch runs at each grid step; kernel_dataflow
and live_work: where values read from refs go), what they build (jaxpr_analysis: a program's
pallas_calls as a `TraceSummary`; traffic: the blocks a pipeline moves; grid_checks: index maps
over the whole grid; provenance: whose code a kernel is; intermediates, parameter_work,
precision: what a program leaves to XLA or computes below the task's precision) and the rules the
structure, coverage and features stages apply to those summaries (one_program, coverage,
features). The worker runs the walkers on the candidate's jaxpr; the host runs the rules.

May import: evaluator.candidate.
"""
