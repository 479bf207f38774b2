"""Where candidate code runs: sandboxed worker processes and what they do.

The host side (sandbox: `Worker`, `WorkerPool`, `Limits`; remote: the same on Ray actors;
backends: which backend a grading runs on; step_limits: how long a case may run), the contract
between host and worker (protocol: typed requests and replies; wire: their framing, no pickle),
and the worker side (worker: its main loop; isolation: rlimits and namespaces; handlers: one
function per request; jax_hooks: the worker's reaches into jax internals; program: the traced
program replayed in interpret mode or lowered for TPU).

May import: evaluator.candidate, evaluator.analysis, evaluator.performance.
"""
