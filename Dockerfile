# Build: docker build -t gpuslice .
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
# .sqlx holds the query data, so no database is needed to build.
RUN SQLX_OFFLINE=true cargo build --release --locked --bin gpuslice \
 && cargo build --release --locked -p gpuslice-shim

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 gpuslice \
 && useradd --system --uid 10001 --gid 10001 --home /var/lib/gpuslice --create-home gpuslice
COPY --from=build /src/target/release/gpuslice /usr/local/bin/gpuslice
# The launch shim `gpuslice exec` preloads into time-sliced shares.
COPY --from=build /src/target/release/libgpuslice_shim.so /usr/lib/gpuslice/libgpuslice_shim.so
# Numeric, so Kubernetes' runAsNonRoot can check it (the chart runs it as 10001).
USER 10001:10001
WORKDIR /var/lib/gpuslice
ENV GPUSLICE_BIND=0.0.0.0:8080 GPUSLICE_DATA_DIR=/var/lib/gpuslice
EXPOSE 8080
# The binary checks itself: Debian's sh is dash, which has no /dev/tcp.
HEALTHCHECK --interval=30s --timeout=5s CMD ["gpuslice", "healthcheck"]
ENTRYPOINT ["gpuslice"]
CMD ["serve"]
