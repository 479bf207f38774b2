"""JAXBench Level 1 workloads (fixture)."""
