# One image for every Nezha component: the entrypoint is the `nezha` command,
# the first argument picks the component (cache, controller, webhook,
# webhook certs, ring, stats, ...). The Helm chart in helm/nezha runs each of
# them from this one image, passing only `args`.
#
#   docker build -t nezha:0.1.0 .
#   docker run --rm nezha:0.1.0                 # nezha --help
#   docker run --rm nezha:0.1.0 cache --help
#
# Runtime: user 10001:10001 (numeric, so `runAsNonRoot` can verify it), and
# nothing is written at run time except the cache's data directory, a mounted
# volume (the chart mounts it at /var/lib/nezha and passes
# --data-dir=/var/lib/nezha/data; the default ./nezha-data also lands under
# the WORKDIR /var/lib/nezha). Byte code is compiled when the wheel is
# installed, so the image works with readOnlyRootFilesystem: true.
#
# Only the runtime dependencies ([project.dependencies] of pyproject.toml) are
# installed, never the [test] extra. Without redis-server in the image, the
# embedded index of local mode (`nezha up`) falls back to fakeredis.
# tests/integration/image/test_image_install.py repeats this install in a
# clean venv and checks each component's command line.

# -- build: a wheel of the project, installed with its dependencies into /opt/nezha
FROM python:3.11-slim-bookworm AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1
# .dockerignore lets in only what the wheel needs: pyproject.toml, README.md
# and the packages.
COPY . /src
RUN python -m pip wheel --no-cache-dir --no-deps --wheel-dir /wheels /src \
 && python -m venv /opt/nezha \
 && /opt/nezha/bin/pip install --no-cache-dir /wheels/*.whl

# -- runtime: the same base image, the venv, a non-root user
FROM python:3.11-slim-bookworm
ENV PATH=/opt/nezha/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
RUN groupadd --system --gid 10001 nezha \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin nezha \
 && mkdir -p /var/lib/nezha \
 && chown 10001:10001 /var/lib/nezha
COPY --from=build /opt/nezha /opt/nezha
WORKDIR /var/lib/nezha
USER 10001:10001
# Documentation only: cache node 8080, controller health 8081, webhook 8443.
EXPOSE 8080 8081 8443
ENTRYPOINT ["nezha"]
CMD ["--help"]
