# hangdoc image: `hangdoc server` by default; the same image runs `hangdoc agent` (the
# DaemonSet in agents/kubernetes/daemonset.yaml passes `agent ...` as arguments).
#
#   docker build -t registry.example.com/hangdoc:0.1.0 .       # from the repository root
#   docker run --rm -p 7430:7430 -v hangdoc-db:/var/lib/hangdoc \
#       -v /etc/hangdoc/token:/etc/hangdoc/token:ro registry.example.com/hangdoc:0.1.0
#
# The image runs as the unprivileged user hangdoc (uid 10001), which is all the server
# needs. The agent needs more, and gets it from where it is run, not from the image: root
# with CAP_SYS_PTRACE (and CAP_DAC_READ_SEARCH) and the node's PID namespace
# (`runAsUser: 0`, `capabilities.add` and `hostPID: true` in the DaemonSet;
# `docker run --user 0 --cap-add SYS_PTRACE --pid host ...`).
#
# No torch: hangdoc reads the jobs from outside. py-spy comes in as a dependency (a static
# binary in its wheel). The postgres extra adds the PostgreSQL driver for --db postgresql://.

FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

COPY . /src
RUN pip install '/src[postgres]' \
    && rm -rf /src \
    && groupadd --system --gid 10001 hangdoc \
    && useradd --system --uid 10001 --gid hangdoc --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin hangdoc \
    && install -d -m 0700 -o hangdoc -g hangdoc /var/lib/hangdoc

# numeric, so that Kubernetes' runAsNonRoot can check it
USER 10001
WORKDIR /var/lib/hangdoc
EXPOSE 7430

ENTRYPOINT ["hangdoc"]
CMD ["server", "--listen", "0.0.0.0:7430", "--db", "/var/lib/hangdoc/incidents.db", "--token-file", "/etc/hangdoc/token"]
