"""The project's tests (a package, so that tests/docker is `tests.docker`, not a `docker` that hides the Docker SDK)."""
