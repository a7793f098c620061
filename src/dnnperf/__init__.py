"""dnnperf: measure, explain, predict and reduce the cost of training deep neural networks."""

__version__ = "0.1.0"
