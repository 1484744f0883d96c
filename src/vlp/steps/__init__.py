"""Pipeline steps: one plain, typed function per DAG node.

A step takes input/output URIs (local paths or ``s3://``) and a :class:`vlp.config.Config`,
does its work through :mod:`vlp.storage`, writes ``summary.json`` into its output and returns
the same summary. The CLI and the KFP components (``components/``) call these functions.
"""

from vlp.steps.common import StepResult, run_step

__all__ = ["StepResult", "run_step"]
