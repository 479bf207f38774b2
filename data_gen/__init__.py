"""Fixit data generation (`python -m data_gen.collect`): not built yet, see the open issue
"Fixit data generation". This package exists so the layout of docs/architecture.md holds."""
