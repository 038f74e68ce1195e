"""The driver: one process per run, where the user started it or `ray job submit` placed it. It sizes the cluster
(ray_cluster.py), builds the plan every worker gets and starts Ray Train's TorchTrainer (launcher.py), runs Tune
sweeps (sweep.py), submits jobs (submit.py), holds the run lock (run_lock.py), and runs plain Ultralytics as the
baseline (native.py).
"""
