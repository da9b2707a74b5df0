# Mosquitto from Debian's package: the MQTT broker the alerts service delivers to inside the stack. Laid out as the
# official eclipse-mosquitto image (config in /mosquitto/config, data in /mosquitto/data), so that compose mounts
# the same configuration into either.
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}

# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends mosquitto mosquitto-clients \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /mosquitto/config /mosquitto/data \
    && chown mosquitto:mosquitto /mosquitto/data
COPY deploy/mosquitto/mosquitto.conf /mosquitto/config/mosquitto.conf

# Started as root, mosquitto drops to its own user (its `user` setting), as in the official image.
VOLUME ["/mosquitto/data"]
EXPOSE 1883
HEALTHCHECK --interval=15s --timeout=5s --retries=3 \
    CMD ["mosquitto_sub", "-h", "127.0.0.1", "-t", "$SYS/broker/uptime", "-C", "1", "-W", "4"]
CMD ["mosquitto", "-c", "/mosquitto/config/mosquitto.conf"]
