"""The performance model: per-operator roofline compute, alpha-beta-gamma collectives and
data/pipeline/tensor parallel strategies, predicting step time, throughput and memory per device.

See docs/performance-model.md. Entry points: :func:`dnnperf.perfmodel.predict.predict` and ``sweep``.
"""
