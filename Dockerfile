# One image for every toolfleet service: `toolfleet init`, `toolfleet worker NAME`,
# `toolfleet api` (see docker-compose.yml).

FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
# services/toolfleet/storage/migrations is a symlink to ../../../infra/migrations:
# copy both trees so it resolves while the wheel is built.
COPY infra/ infra/
COPY services/ services/
# The image runs workers and the API: the `fleet` and `api` extras, not the dev stack
# (embedded broker, Postgres and Redis binaries).
# The installed package must carry the SQL migrations (pyproject's package-data has
# missed them): copy them in if the wheel did not, then check.
RUN python -m venv /opt/toolfleet \
 && /opt/toolfleet/bin/pip install '.[fleet,api]' \
 && pkg="$(/opt/toolfleet/bin/python -c 'import os, toolfleet.storage as s; print(os.path.dirname(s.__file__))')" \
 && if ! ls "$pkg"/migrations/*.sql >/dev/null 2>&1; then \
      mkdir -p "$pkg/migrations" && cp infra/migrations/*.sql "$pkg/migrations/"; \
    fi \
 && /opt/toolfleet/bin/python -c 'from toolfleet.storage.postgres import migration_files as m; assert m(), "no migrations in the image"'

FROM python:3.11-slim
RUN useradd --system --uid 10001 --user-group --create-home --home-dir /home/toolfleet toolfleet
COPY --from=build /opt/toolfleet /opt/toolfleet
ENV PATH=/opt/toolfleet/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    TOOLFLEET_API_HOST=0.0.0.0 \
    TOOLFLEET_LOG_FORMAT=json
WORKDIR /home/toolfleet
USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["toolfleet"]
CMD ["--help"]
