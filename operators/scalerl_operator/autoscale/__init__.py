"""The RL-aware autoscaler of the generator and verifier pools.

Owns the decision math, pure (`autoscaler`: the metric proposals, verifier lag and learner starvation;
`hpa`: the HorizontalPodAutoscaler v2 normaliser, stabilisation windows and rate limits) and one pass
for one RLJob that reads the metrics, decides and writes `/scale` (`scaler`). May import
`scalerl_operator.api`, `render` and `cluster` (the math only `api` and `cluster.scheduling`); never
`control`, which drives it.
"""
