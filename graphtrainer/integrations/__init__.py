"""Adapters to other projects' services, each needing its own optional package: an MLflow
logger (:mod:`.mlflow_logger`, ``pip install mlflow-skinny``)."""
