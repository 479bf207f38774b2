"""attention_fwd_causal: attention_fwd with a causal mask (query i sees keys j <= i)."""
from pathlib import Path

from tasks.attention_fwd.task import build_task
from tasks.references import attention_reference


def reference(q, k, v):
    return attention_reference(q, k, v, causal=True)


TASK = build_task(
    name="attention_fwd_causal",
    description=("Causal multi-head attention forward: query i attends to keys j <= i; "
                 "softmax(q @ k^T * head_dim**-0.5) @ v, softmax in float32; output in q.dtype."),
    reference_fn=reference,
    solution_path=Path(__file__).with_name("solution.py"),
    necessary_flops_share=0.5,  # the masked upper triangle of the logits need not be computed
)
