# hydraplan REST service image: no torch, no compilers at run time, runs as a non-root user.
#   docker build -t hydraplan .
#   docker run -p 8000:8000 -e HYDRAPLAN_API_TOKEN=... hydraplan

# --- builder: the hydraplan wheel (built as CI builds and checks it: python -m build), then the
#     wheels of every dependency of its service extra ---------------------------------------
FROM python:3.11-slim AS builder
WORKDIR /src
COPY pyproject.toml README.md ./
COPY hydraplan ./hydraplan
COPY planner ./planner
COPY cost_models ./cost_models
COPY api ./api
COPY runtime ./runtime
RUN python -m pip install --no-cache-dir --upgrade pip build \
 && python -m build --wheel --outdir /dist . \
 && python -m pip wheel --wheel-dir /wheels "$(echo /dist/hydraplan-*.whl)[service]"

# --- runtime: install from the wheels only (no index, no build tools) -----------------------
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=builder /wheels /wheels
RUN python -m pip install --no-cache-dir --no-index --find-links=/wheels "hydraplan[service]" \
 && rm -rf /wheels \
 && useradd --create-home --uid 10001 hydraplan
USER hydraplan
WORKDIR /home/hydraplan
# the planner's Numba kernels compiled once into the image (site-packages is not writable here)
ENV NUMBA_CACHE_DIR=/home/hydraplan/.cache/numba
RUN python -c "from hydraplan.planner.kernels import warm_up; warm_up()"
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4)"]
CMD ["hydraplan", "serve", "--host", "0.0.0.0", "--port", "8000"]
