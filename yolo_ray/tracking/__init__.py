"""MLflow: the run's params, per-epoch metrics, plots and checkpoints (mlflow_runs.py), the model registry
(registry.py), and the ONNX export that gets registered (export.py).
"""
