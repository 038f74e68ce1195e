from yolo_ray.cli import main

raise SystemExit(main())
