"""Client-side SageMaker SDK builders (training jobs, endpoints): run on a laptop or notebook, never
inside the container."""
