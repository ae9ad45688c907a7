"""The image fixture, shared with the container tests."""

from tests.containers.conftest import container_image  # noqa: F401
