"""What starts before any work imports neither torch nor OpenCV: the CLI building every command's parser
(`yolov5-smddp -h`, and a bad option's message), the SageMaker driver up to its own option check, and the
job builders on the user's machine. These modules keep those imports inside the functions that need them;
every other module imports at its top (unless the dependency is optional)."""

from child_python import run_python

FAST_PATH = """
import sys
from yolov5_smddp import cli, launch
from yolov5_smddp.client import job
from yolov5_smddp.config import worker_config
from yolov5_smddp.sagemaker import driver
cli.build_parser()
print(sorted(m for m in ("torch", "cv2", "matplotlib") if m in sys.modules))
"""


def test_the_cli_parser_the_driver_and_the_job_builders_import_neither_torch_nor_cv2():
    proc = run_python(FAST_PATH, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "[]"
