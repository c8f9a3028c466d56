"""The SageMaker boundary: the ONLY package that reads SM_* variables and the /opt/ml tree.

- env.py           `read_environment(environ)` → `SageMakerEnv` (pure reader of a Mapping + config files)
- local_config.py  a single-host input/config for plain `docker run IMAGE train ...`
- dataset.py       data.yaml rebased onto the channels; the label scan before any worker starts
- efa.py           EFA/NCCL variables for the workers of our elastic launcher
- failure.py       the failure file and the exit-code contract
- driver.py        `main()` (entrypoint.py, docker/entry.py) and `run_job()`: options → launch

Everything else receives plain paths and values.
"""

from yolov5_smddp.sagemaker.driver import main

__all__ = ["main"]
