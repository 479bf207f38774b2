"""
Level 1 - Task 50: a convolution whose weights are only set later from a PyTorch state dict
(set_weights); Model holds None until then, so forward() cannot run on its own. Fixture.
"""

import jax
import jax.numpy as jnp
from jax import lax


class Model:
    def __init__(self, num_classes=1000):
        self.conv1_weight = None
        self.conv1_bias = None

    def set_weights(self, weights_dict):
        for name, value in weights_dict.items():
            setattr(self, name.replace('.', '_'), jnp.array(value))

    def forward(self, x):
        x = jnp.transpose(x, (0, 2, 3, 1))
        w = jnp.transpose(self.conv1_weight, (2, 3, 1, 0))
        y = lax.conv_general_dilated(x, w, (4, 4), ((2, 2), (2, 2)),
                                     dimension_numbers=('NHWC', 'HWIO', 'NHWC'))
        return jnp.transpose(y + self.conv1_bias, (0, 3, 1, 2))


batch_size = 256
num_classes = 1000


def get_inputs():
    key = jax.random.PRNGKey(0)
    return [jax.random.uniform(key, shape=(batch_size, 3, 224, 224))]


def get_init_inputs():
    return [num_classes]
