"""Events described from several frames (`visioncap bench events`): image tokens, latency and the gateway's pacing
for 1, 3 and 6 frames a request (run)."""
