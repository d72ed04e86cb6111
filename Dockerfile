# ac7 serve in a container: `docker build -t ac7 .` then
#   docker run -p 8717:8717 -v ac7-data:/var/lib/ac7 \
#     -v "$PWD/packaging/team.example.json:/etc/ac7/team.json:ro" ac7
# The first start prints the members' tokens and the web app's setup URL (docker logs).
# With PostgreSQL (and replicas): compose.yaml.

FROM rust:1.95-slim-bookworm AS build
WORKDIR /src
COPY . .
# The commit `ac7 --version` names, when .git was part of the build context.
RUN apt-get update && apt-get install -y --no-install-recommends git \
    && rm -rf /var/lib/apt/lists/*
RUN cargo build --release --locked -p ac7-runtime --bin ac7

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --user-group --home-dir /var/lib/ac7 --shell /usr/sbin/nologin ac7 \
    && install -d -o ac7 -g ac7 -m 0700 /var/lib/ac7
COPY --from=build /src/target/release/ac7 /usr/local/bin/ac7
USER ac7:ac7
ENV AC7_HOST=0.0.0.0 \
    AC7_PORT=8717 \
    AC7_DB=/var/lib/ac7/ac7.db
VOLUME /var/lib/ac7
EXPOSE 8717
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/ac7"]
CMD ["serve", "--team-config", "/etc/ac7/team.json"]
