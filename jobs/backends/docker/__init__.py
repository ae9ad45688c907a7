"""The docker backend: one compose service per node (podman-compose or docker compose)."""
