# One image for every toolfleet service: `toolfleet init`, `toolfleet worker NAME` (policy,
# executor, validator, audit, status, maintenance, analytics), `toolfleet api` (see
# docker-compose.yml and infra/k8s/).

FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
# services/toolfleet/storage/migrations is a symlink to ../../../infra/migrations:
# copy both trees so it resolves while the wheel is built.
COPY infra/ infra/
COPY services/ services/
# The image runs every worker the README documents and the API: the `fleet`, `api` and
# `analytics` extras (`toolfleet worker analytics` is the faust-streaming app), not the
# dev stack (embedded broker, Postgres and Redis binaries).
# The installed package must carry the SQL migrations (pyproject's package-data has
# missed them): copy them in if the wheel did not, then check. The last step imports
# what each command of the image loads, so a missing extra fails the build, not a pod.
RUN python -m venv /opt/toolfleet \
 && /opt/toolfleet/bin/pip install '.[fleet,api,analytics]' \
 && pkg="$(/opt/toolfleet/bin/python -c 'import os, toolfleet.storage as s; print(os.path.dirname(s.__file__))')" \
 && if ! ls "$pkg"/migrations/*.sql >/dev/null 2>&1; then \
      mkdir -p "$pkg/migrations" && cp infra/migrations/*.sql "$pkg/migrations/"; \
    fi \
 && /opt/toolfleet/bin/python -c 'from toolfleet.storage.postgres import migration_files as m; assert m(), "no migrations in the image"' \
 && /opt/toolfleet/bin/python -c 'import importlib, sys; [importlib.import_module(m) for m in sys.argv[1:]]' \
      toolfleet.policy.handler toolfleet.executor.handler toolfleet.validator.handler \
      toolfleet.audit.handler toolfleet.status.handler toolfleet.maintenance.handler \
      toolfleet.analytics.app toolfleet.api uvicorn toolfleet.devstack.bootstrap

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
