import sys

from yolov5_smddp.cli import main

sys.exit(main())
