"""vlp: video-language pre-training (ALPRO, ALBEF, TS2-Net) as a Kubeflow Pipelines DAG."""

__version__ = "0.1.0"
