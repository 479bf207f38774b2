"""A truncated answer: the def line never closes."""
def kernel(x:
    return x
# task: softmax  expect: syntax_error
