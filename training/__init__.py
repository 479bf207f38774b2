"""Fine-tuning on Fixit data and re-benchmarking: sft.py (TRL + PEFT), tiny_model.py (offline
smoke model), rebench.py (pass@k of models side by side), generalization.py (kernels re-graded on
held-out shapes), metrics.py. See docs/training.md."""
