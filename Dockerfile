# gapless in a container (docs/deploy.md): a multi-stage build, a small
# runtime image, a non-root user, the journal on a volume, and a health check
# on /readyz.
#   docker build -t gapless .
#   docker run -p 8080:8080 -v gapless-data:/var/lib/gapless gapless
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p gapless \
 && strip target/release/gapless

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --home-dir /var/lib/gapless --shell /usr/sbin/nologin gapless \
 && mkdir -p /var/lib/gapless \
 && chown gapless:gapless /var/lib/gapless
COPY --from=build /src/target/release/gapless /usr/local/bin/gapless
USER gapless
VOLUME ["/var/lib/gapless"]
ENV GAPLESS_LISTEN=0.0.0.0:8080 \
    GAPLESS_DATA_DIR=/var/lib/gapless
EXPOSE 8080
# Ready = the journal accepts appends (not ready while the disk is below its reserve).
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
  CMD curl -fsS http://127.0.0.1:8080/readyz >/dev/null || exit 1
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/gapless"]
CMD ["serve"]
