# syntax=docker/dockerfile:1
# Toron as a container (SPEC 18): the static binary in a distroless image, run as a numeric
# non-root user, reading /etc/toron/config.yaml and /etc/toron/routes.yaml, with -watch so that a
# ConfigMap mounted at /etc/toron reloads itself. See docs/operations.md.
#
#   docker build -t toron .
#   docker run --rm -p 8080:8080 toron
#
# The image ships the repository's conf/ files as a starting point; mount your own over
# /etc/toron (a ConfigMap in Kubernetes: deploy/kubernetes/).

# --- build: the static binary ------------------------------------------------------------------
FROM golang:1.26 AS build
WORKDIR /src
# Modules first, so that a source change does not download them again.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
# CGO_ENABLED=0: a static binary, no libc in the image; -trimpath and -s -w as `make build`.
RUN CGO_ENABLED=0 GOOS=linux go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/toron . \
 && mkdir -p /out/etc/toron \
 && cp conf/config.yaml conf/routes.yaml /out/etc/toron/

# --- run: distroless static (CA certificates, /etc/passwd with nonroot 65532, no shell) --------
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/toron /usr/local/bin/toron
COPY --from=build /out/etc/toron/ /etc/toron/
# Numeric, so that Kubernetes can verify runAsNonRoot without reading /etc/passwd.
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/toron", "-watch", "-config", "/etc/toron/config.yaml", "-routes", "/etc/toron/routes.yaml"]
