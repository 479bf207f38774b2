"""The evaluator: turns (task, candidate source) into a verdict.

The front door is this folder's top level: `grader.py` (`Evaluator`: grade one candidate or many,
on warm workers, through the verdict cache), `stages.py` (the stages, one ordered list, `STAGES`),
`record.py` (`Verdict`, `Status`: the one record every later part reads), `cache.py` and
`digest.py` (verdicts kept, keyed by content hashes of what decides them), `tune.py` (block sizes
searched through the static stages). The stages call into the subpackages, each one concern:

- `candidate/`: the candidate as text, before anything runs (extraction, policy, knobs);
- `analysis/`: what a traced program does, read from its jaxpr without running it;
- `performance/`: TPU generations, VMEM budgets and the static time estimate;
- `execution/`: sandboxed workers that load, trace, lower, compile and run candidates;
- `truth/`: the host's inputs, reference outputs and the tolerance comparison.

A subpackage never imports the front door; each one's docstring says which others it may import
(tests/test_architecture.py holds them to it). docs/architecture.md draws the map.
"""
