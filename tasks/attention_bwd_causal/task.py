"""attention_bwd_causal: attention_bwd with a causal mask (query i sees keys j <= i)."""
from pathlib import Path

from tasks.attention_bwd.task import build_task, make_inputs_for
from tasks.references import attention_bwd_reference


def reference(q, k, v, o, lse, do):
    return attention_bwd_reference(q, k, v, o, lse, do, causal=True)


def make_inputs(case, rng):
    return make_inputs_for(case, rng, causal=True)


def large_logit_inputs(case, rng):
    return make_inputs_for(case, rng, causal=True, large_logits=True)


TASK = build_task(
    name="attention_bwd_causal",
    description=("Causal multi-head attention backward (query i attends to keys j <= i): dq, dk, dv "
                 "of softmax(q @ k^T * head_dim**-0.5) @ v given o, lse (natural-log logsumexp of "
                 "the scaled, masked logits, float32) and do; float32 math, outputs in q.dtype."),
    reference_fn=reference,
    make_inputs_fn=make_inputs,
    large_logit_inputs_fn=large_logit_inputs,
    solution_path=Path(__file__).with_name("solution.py"),
    necessary_flops_share=0.5,  # the masked upper triangle of the logits need not be computed
)
