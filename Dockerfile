# syntax=docker/dockerfile:1
# The appliance image: `appliance VERB key=value ...` (the Helm chart in helm/appliance runs it).
#   docker build -t REGISTRY/appliance:0.1.0 .                                  # CPU (the default)
#   docker build -t REGISTRY/appliance:0.1.0-cuda --build-arg VARIANT=cuda .    # CUDA: torch's CUDA build + xformers
# The tags are the chart's default image tags (appVersion, "-cuda" when gpu.count > 0). docs/deploy.md.
ARG PYTHON_VERSION=3.11
FROM python:${PYTHON_VERSION}-slim

# cpu or cuda. CUDA's libraries come as torch's wheels; the driver comes from the node.
ARG VARIANT=cpu
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_CPU=https://download.pytorch.org/whl/cpu
ARG TORCH_INDEX_CUDA=https://download.pytorch.org/whl/cu128

# A C compiler: the engine's CPU kernels are built below and found through it at run time (docs/engine.md).
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev libgomp1 \
 && rm -rf /var/lib/apt/lists/*

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    APPLIANCE_CONF_DIR=/opt/appliance/conf \
    XDG_CACHE_HOME=/opt/appliance/cache

# torch first, from the variant's index, so that the package's `torch==` pin finds it installed.
RUN case "$VARIANT" in \
      cpu) index="$TORCH_INDEX_CPU" ;; \
      cuda) index="$TORCH_INDEX_CUDA" ;; \
      *) echo "VARIANT must be cpu or cuda, got $VARIANT" >&2; exit 1 ;; \
    esac \
 && pip install --index-url "$index" "torch==${TORCH_VERSION}"

# The package (its embedded demo models included) and the config tree beside it; xformers for CUDA.
RUN --mount=type=bind,target=/src,rw \
    pip install /src \
 && mkdir -p /opt/appliance \
 && cp -r /src/conf "$APPLIANCE_CONF_DIR" \
 && if [ "$VARIANT" = cuda ]; then pip install --no-deps "xformers>=0.0.35"; fi

# The CPU kernels, built now into $XDG_CACHE_HOME: the container's root file system is read-only.
RUN python -m appliance.engine.build_kernels

# A fixed non-root uid, the chart's podSecurityContext.runAsUser.
RUN useradd --uid 10001 --user-group --no-create-home --home-dir /tmp appliance
USER 10001:10001
WORKDIR /tmp
EXPOSE 8000
ENTRYPOINT ["appliance"]
CMD ["serve", "server.host=0.0.0.0"]
