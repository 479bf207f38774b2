"""Fine-tuning (`python -m training.sft`) and re-benchmarking: not built yet, see the open issue
"Fine-tuning and re-benchmarking". This package exists so the layout of docs/architecture.md holds."""
