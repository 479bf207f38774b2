"""The conversation with a model: what it reads (the task prompt, the hardware context, the
evaluator's feedback) and who answers (an OpenAI-compatible endpoint or a local model).

Both consumers use it: data_gen (collecting repair pairs) and training (re-benchmarking tuned
models); neither owns it (docs/architecture.md).
"""
