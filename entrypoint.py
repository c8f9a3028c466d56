"""SageMaker training program (the image's SAGEMAKER_PROGRAM, in /opt/ml/code).

The toolkit runs `python entrypoint.py --key value ...` with the job's hyperparameters. Everything happens
in `yolov5_smddp.sagemaker.main`: read the SageMaker contract, validate the hyperparameters, check the
dataset, start the workers, and on failure write /opt/ml/output/failure and exit non-zero.
"""

import sys

from yolov5_smddp.sagemaker import main

if __name__ == "__main__":
    sys.exit(main())
