"""Measuring tools behind `yolo-ray bench`: throughput and memory (throughput.py), the parity benchmark across
paths and seeds (parity.py), and the independent COCO scorer it uses (coco_eval.py).
"""
