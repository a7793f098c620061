"""``dnnperf watch``: system-level profiling of any command's process tree (:func:`.run.watch`)."""
