"""KFP v2 pipelines: the pre-training DAG, the re-evaluation DAG, their config, compile/submit/local-run tools."""
