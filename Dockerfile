# syntax=docker/dockerfile:1
# Builds both binaries: the console (cmd/console) and the terminal daemon
# (cmd/agentd). The runtime image runs the console by default; the compose
# file starts agentd from the same image with another entrypoint.

FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
ENV CGO_ENABLED=0 GOFLAGS=-trimpath
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    go build -ldflags="-s -w" -o /out/console ./cmd/console && \
    go build -ldflags="-s -w" -o /out/agentd ./cmd/agentd

# debian-slim rather than distroless: agentd runs people's shell commands,
# so the image needs a shell and the usual tools.
FROM debian:bookworm-slim
RUN apt-get update && \
    apt-get install -y --no-install-recommends ca-certificates bash procps curl && \
    rm -rf /var/lib/apt/lists/* && \
    useradd --system --uid 10001 --create-home --home-dir /home/gatehouse --shell /bin/bash gatehouse && \
    mkdir -p /data /workspace && chown gatehouse:gatehouse /data /workspace
COPY --from=build /out/console /out/agentd /usr/local/bin/
USER gatehouse
WORKDIR /home/gatehouse
# The embedded default keeps its SQLite files and generated master key here.
ENV GATEHOUSE_DATA_DIR=/data GATEHOUSE_LISTEN=0.0.0.0:8080
VOLUME ["/data"]
EXPOSE 8080 49984
ENTRYPOINT ["/usr/local/bin/console"]
CMD ["serve"]
