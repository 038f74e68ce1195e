"""What runs inside each Ray Train worker: the training loop (loop.py: ranks, resume, Ultralytics' trainer attached
to Ray's process group), the trainer adaptation (trainer.py), the background checkpoint writer, CUDA graphs,
profiling and asynchronous validation. It reads the typed plan (yolo_ray/worker_plan.py) and nothing else from
the driver.
"""
