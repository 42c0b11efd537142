"""Training, experiment tracking and the model registry (imports torch, SB3 and MLflow lazily)."""
