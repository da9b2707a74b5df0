# A stand-in for the official PostgreSQL image, built from Debian's PostgreSQL 15 (the official image of
# docker-compose.yml is 17): the same environment contract (POSTGRES_USER, POSTGRES_PASSWORD or
# POSTGRES_PASSWORD_FILE, POSTGRES_DB, PGDATA), the same data directory, a pg_isready health check.
# A data directory is tied to its major version: one made by this image does not open in the official 17 one.
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}

# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends postgresql-15 \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /var/lib/postgresql/data /var/run/postgresql \
    && chown -R postgres:postgres /var/lib/postgresql /var/run/postgresql

ENV PATH=/usr/lib/postgresql/15/bin:$PATH \
    PGDATA=/var/lib/postgresql/data
COPY deploy/postgres/entrypoint.sh /usr/local/bin/docker-entrypoint.sh

VOLUME ["/var/lib/postgresql/data"]
EXPOSE 5432
STOPSIGNAL SIGINT
HEALTHCHECK --interval=10s --timeout=5s --start-period=20s --retries=5 \
    CMD ["sh", "-c", "pg_isready -h 127.0.0.1 -U \"${POSTGRES_USER:-postgres}\" -d \"${POSTGRES_DB:-${POSTGRES_USER:-postgres}}\""]
ENTRYPOINT ["docker-entrypoint.sh"]
CMD ["postgres"]
