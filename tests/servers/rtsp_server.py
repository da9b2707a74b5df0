"""A real RTSP camera for tests: serves a video file as H.264 over RTSP, looping it forever.

Runs under Debian's /usr/bin/python3, the only interpreter with GStreamer's introspection bindings (`gi`):

    /usr/bin/python3 tests/servers/rtsp_server.py VIDEO --port 0 --mount /stream

Prints `READY rtsp://127.0.0.1:PORT/MOUNT` once it accepts clients and exits cleanly on SIGTERM or SIGINT.

The file is played by its own pipeline into an `intervideosink`; every RTSP client's encoder reads the
`intervideosrc` side. That decouples the camera's clock from the clients: the "camera" runs whether or not
anyone watches, a client joining late sees the current picture instead of the file's start, and looping the
file (a seek to 0 on EOS) never tears down the RTSP session.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

import gi

gi.require_version("Gst", "1.0")
gi.require_version("GstRtspServer", "1.0")
from gi.repository import GLib, Gst, GstRtspServer  # noqa: E402

# Low latency and a key frame every 10 frames so that a client reconnecting mid-stream can decode within a
# second; no B-frames because the payloader then never has to hold frames back.
ENCODER = "x264enc tune=zerolatency speed-preset=ultrafast key-int-max=10 bframes=0"


def _fail(message: str) -> None:
    print(f"rtsp_server: {message}", file=sys.stderr, flush=True)
    sys.exit(1)


def _start_player(video: str, channel: str) -> tuple[Gst.Pipeline, Gst.Caps]:
    """Play `video` in real time into the inter channel; returns the pipeline and its negotiated raw caps."""
    player = Gst.parse_launch(
        f"filesrc name=src ! decodebin ! videoconvert ! video/x-raw,format=I420 "
        f"! intervideosink name=out channel={channel} sync=true"
    )
    # Set as a property, not in the launch string, so that no file name needs quoting.
    player.get_by_name("src").set_property("location", video)
    # Preroll first so that the clients' pipeline can be built with the file's exact size and rate; the
    # inter source would otherwise start at its default 320x240 and renegotiate mid-stream.
    player.set_state(Gst.State.PAUSED)
    result, _, _ = player.get_state(10 * Gst.SECOND)
    if result == Gst.StateChangeReturn.FAILURE:
        _fail(f"cannot play {video}")
    caps = player.get_by_name("out").get_static_pad("sink").get_current_caps()
    if caps is None:
        _fail(f"no video stream in {video}")
    return player, caps


def _loop_on_eos(bus: Gst.Bus, message: Gst.Message, player: Gst.Pipeline, loop: GLib.MainLoop) -> bool:
    if message.type == Gst.MessageType.EOS:
        # A flushing seek restarts the file and resets the running time, so the sink keeps real-time pacing.
        player.seek_simple(Gst.Format.TIME, Gst.SeekFlags.FLUSH | Gst.SeekFlags.KEY_UNIT, 0)
    elif message.type == Gst.MessageType.ERROR:
        error, debug = message.parse_error()
        print(f"rtsp_server: player error: {error.message} ({debug})", file=sys.stderr, flush=True)
        loop.quit()
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("video")
    parser.add_argument("--port", type=int, default=0, help="TCP port; 0 picks a free one")
    parser.add_argument("--mount", default="/stream")
    parser.add_argument("--host", default="127.0.0.1")
    args = parser.parse_args()
    if not os.path.isfile(args.video):
        _fail(f"no such video file: {args.video}")
    mount = args.mount if args.mount.startswith("/") else "/" + args.mount

    Gst.init(None)
    loop = GLib.MainLoop()
    channel = f"visioncap-{os.getpid()}"
    player, caps = _start_player(args.video, channel)
    structure = caps.get_structure(0)
    width, height = structure.get_value("width"), structure.get_value("height")
    ok, num, den = structure.get_fraction("framerate")
    if not ok or num <= 0:
        num, den = 25, 1

    factory = GstRtspServer.RTSPMediaFactory()
    factory.set_launch(
        f"( intervideosrc channel={channel} "
        f"! video/x-raw,format=I420,width={width},height={height},framerate={num}/{den} "
        f"! {ENCODER} ! rtph264pay name=pay0 pt=96 config-interval=1 )"
    )
    # One encoder for all clients, like a real camera.
    factory.set_shared(True)

    server = GstRtspServer.RTSPServer()
    server.set_address(args.host)
    server.set_service(str(args.port))
    server.get_mount_points().add_factory(mount, factory)
    # attach() binds the listening socket (GLib sets SO_REUSEADDR), so a restart can take the same port at once.
    if server.attach(None) == 0:
        _fail(f"cannot listen on {args.host}:{args.port}")

    bus = player.get_bus()
    bus.add_signal_watch()
    bus.connect("message", _loop_on_eos, player, loop)
    player.set_state(Gst.State.PLAYING)

    for signum in (signal.SIGTERM, signal.SIGINT):
        GLib.unix_signal_add(GLib.PRIORITY_DEFAULT, signum, loop.quit)

    print(f"READY rtsp://{args.host}:{server.get_bound_port()}{mount}", flush=True)
    try:
        loop.run()
    finally:
        player.set_state(Gst.State.NULL)


if __name__ == "__main__":
    main()
