"""Plain-PyTorch models of the workload suite, one module per application domain."""
