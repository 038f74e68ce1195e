"""yolo_ray: Ultralytics YOLO11 training on Ray Train (DDP across GPUs and nodes), Ray Tune sweeps and MLflow."""

__version__ = "0.1.0"
