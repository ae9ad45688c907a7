# The trainer's image: `python -m torchjob.trainer` and everything it needs (torch, numpy, scikit-learn's
# digits data, matplotlib, tqdm), a non-root user, nothing else running.
#
#   docker build -t torchjob .                                  # CPU, from python:3.11-slim
#   docker build --build-arg BASE_IMAGE=pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime -t torchjob .
#                                      # GPU: a PyTorch CUDA image already carries torch, used as is
#   scripts/container-setup            # here: podman, a debootstrap base, the local CPU wheel
# The build context needs trainer/ (the one package of ours the image runs: every launcher
# renders a command for it) and, optionally, build/wheels: a checkout is one, and torchjob run
# --to docker assembles one from the installed package when the image is missing.
#
# No ENTRYPOINT: the command is exactly what the caller gives, so one image serves every launcher.
#   docker run IMAGE                                    # trains the default job, one process
#   docker run --shm-size 1g IMAGE python -m torchjob.trainer.agent --standalone --nproc-per-node 2 \
#       -m torchjob.trainer --epochs 12                          # torchrun (same arguments), 2 processes
#   PyTorchJob pod: command [python, -m, torchjob.trainer.agent, ...]; torchrun reads the PET_* variables
#       the operator injects (PET_NNODES, PET_NODE_RANK, PET_MASTER_ADDR, ...).
#   srun ... podman run --rm --network host --env 'SLURM_*' IMAGE python -m torchjob.trainer
#       (one container per task; the trainer reads SLURM_PROCID etc.), or with pyxis:
#   srun --container-image=IMAGE python -m torchjob.trainer      (pyxis runs as the calling user, not
#       uid 1000: nothing is kept in $HOME; give --run-dir a path that user can write)
# Run directories go to /workspace/runs: mount a volume there to keep them.

# CPU default for users with a registry. Any image with Python >= 3.10 works.
ARG BASE_IMAGE=python:3.11-slim

# --- wheels: build/wheels if present (scripts/container-setup puts the local CPU torch wheel
# there; the glob lets the build go on without it, trainer/__init__.py is there so that the
# COPY always has a source). Only mounted below, never in the image.
FROM ${BASE_IMAGE} AS wheels
COPY trainer/__init__.py build/wheel[s] /wheels/

# --- the image ----------------------------------------------------------------------------------
FROM ${BASE_IMAGE}
ARG TORCH_PIN=torch==2.13.0
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH \
    MPLCONFIGDIR=/tmp/matplotlib
# uid 1000 (numeric USER below: Kubernetes' runAsNonRoot can check it); some bases have one.
RUN (getent passwd 1000 >/dev/null || useradd --uid 1000 --create-home --shell /bin/bash trainer) \
    && mkdir -p /workspace && chown 1000:0 /workspace && chmod 0775 /workspace
# --system-site-packages: a torch that the base image carries (the CUDA images) stays visible.
RUN python3 -m venv --system-site-packages /opt/venv
# `slim`, run in the same layer as each install (a later layer cannot shrink an earlier one):
# what a training run never loads leaves the venv: torch's C++ test binaries (torch/test,
# torch/bin but its shm manager), its C++ headers (for building extensions; the image has no
# compiler) and every package's own test suite (*/tests). About 250 MB.
RUN printf '%s\n' '#!/bin/sh' 'set -eu' \
        'site=$(python -c "import sysconfig; print(sysconfig.get_path(\"purelib\"))")' \
        'rm -rf "$site/torch/test" "$site/torch/include"' \
        '[ ! -d "$site/torch/bin" ] || find "$site/torch/bin" -mindepth 1 -maxdepth 1 ! -name torch_shm_manager -exec rm -rf {} +' \
        'find "$site" -depth -type d -name tests -prune -exec rm -rf {} +' \
        > /usr/local/bin/slim && chmod 0755 /usr/local/bin/slim
# torch, in order: the wheel from build/wheels, the base image's own torch, or PyTorch's CPU
# index (PyPI's Linux torch is the multi-GB CUDA build).
RUN --mount=type=bind,from=wheels,source=/wheels,target=/wheels \
    if ls /wheels/torch-*.whl >/dev/null 2>&1; then \
        pip install --find-links /wheels "$TORCH_PIN"; \
    elif python -c "import torch" 2>/dev/null; then \
        python -c "import torch; print('torch from the base image:', torch.__version__)"; \
    else \
        pip install --index-url https://download.pytorch.org/whl/cpu \
            --extra-index-url https://pypi.org/simple "$TORCH_PIN"; \
    fi \
    && slim
# What trainer/ imports besides torch (pyproject.toml lists the same), and pyyaml, small and
# kept for users' scripts that read a YAML config. py-spy: the hang watchdog's stacks (it reads
# a stopped worker's memory as the same uid 1000, without ptrace-attaching: trainer/hang.py).
# scikit-learn without its dependencies: the trainer never imports it, it only reads the digits
# file the wheel carries (trainer/tasks.py), so scipy & co. (~150 MB) stay out of the image.
# A task of your own that imports sklearn: add `pip install scipy joblib threadpoolctl`.
RUN pip install "numpy>=1.24" "matplotlib>=3.7" "tqdm>=4.60" "pyyaml>=6" "py-spy>=0.3" \
    && pip install --no-deps "scikit-learn>=1.3" && slim
# The trainer, where an install puts it (the venv's site-packages), compiled there since the
# image's user cannot write __pycache__. The launchers (jobs/, k8s/, slurm/) run on the host.
# The package is torchjob.trainer (torchjob a namespace package, as a pip install makes it), so
# that a user's own trainer.py in an image built on this one is not confused with it.
COPY trainer /src/trainer
RUN site=$(python -c 'import sysconfig; print(sysconfig.get_path("purelib"))') \
    && mkdir -p "$site/torchjob" && mv /src/trainer "$site/torchjob/trainer" && rm -rf /src \
    && python -m compileall -q "$site/torchjob"
USER 1000
WORKDIR /workspace
ENTRYPOINT []
CMD ["python", "-m", "torchjob.trainer"]
