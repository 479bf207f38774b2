"""Stage 8's timer, exercised on the CPU (a real TPU is needed for the stage itself)."""
import jax
import jax.numpy as jnp

from evaluator.execution.handlers import time_callable


def test_time_callable_returns_one_positive_sample_per_call():
    calls = []

    def fn(x):
        calls.append(1)
        return jnp.sin(x)

    samples = time_callable(fn, [jnp.ones((256, 256))], warmup=2, iters=5)
    assert len(samples) == 5 and all(s > 0 for s in samples)
    assert len(calls) == 7


def test_time_callable_waits_for_the_result():
    big = jax.jit(lambda x: (x @ x).sum())
    x = jnp.ones((512, 512))
    samples = time_callable(big, [x], warmup=1, iters=3)
    assert min(samples) > 1e-5  # not just the async dispatch
