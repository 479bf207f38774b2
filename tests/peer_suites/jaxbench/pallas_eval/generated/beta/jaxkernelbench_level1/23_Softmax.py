Let me think about the block shape first. The row has 393216 elements, so a whole row does not
fit in VMEM; I will tile the columns and keep a running max and sum.

Let's check if `(256, 2048)` is better.

```python
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def _stats_kernel(x_ref, m_ref, l_ref):
    x = x_ref[...]
    m_ref[...] = jnp.max(x, axis=1, keepdims=True)
