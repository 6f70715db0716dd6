#!/usr/bin/env python3
"""A real libzmq publisher (pyzmq) driven line by line from stdin, for the router's load tests.

It binds an XPUB socket on 127.0.0.1 (a PUB that also reports subscriptions, so a test can wait
until the router's SUB has subscribed before sending) and answers every command with one JSON line
on stdout:

  {"cmd": "port"}                              -> {"port": P}
  {"cmd": "wait_subscribed", "timeout_ms": T}  -> {"subscribed": true, "topic": "..."} or false
  {"cmd": "send", "frames": [hex, ...]}        -> {"sent": n_frames}
  {"cmd": "quit"}                              -> {"bye": true}, then exit

Runs with the fleet venv's python (pyzmq, libzmq 4.3.5); binds loopback only; exits when stdin
closes.
"""
import json
import sys
import time

import zmq


def main() -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.XPUB)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.XPUB_VERBOSE, 1)
    port = sock.bind_to_random_port("tcp://127.0.0.1")

    def answer(obj: dict) -> None:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        msg = json.loads(line)
        cmd = msg.get("cmd")
        if cmd == "port":
            answer({"port": port})
        elif cmd == "wait_subscribed":
            # Skip unsubscriptions (a subscriber that went away) until a subscription arrives.
            deadline = time.monotonic() + int(msg.get("timeout_ms", 10000)) / 1000.0
            found = None
            while found is None:
                left_ms = int((deadline - time.monotonic()) * 1000)
                if left_ms <= 0 or not sock.poll(left_ms, zmq.POLLIN):
                    break
                sub = sock.recv()
                if sub[:1] == b"\x01":
                    found = sub[1:].decode("utf-8", "replace")
            if found is None:
                answer({"subscribed": False})
            else:
                answer({"subscribed": True, "topic": found})
        elif cmd == "send":
            frames = [bytes.fromhex(h) for h in msg["frames"]]
            sock.send_multipart(frames)
            answer({"sent": len(frames)})
        elif cmd == "quit":
            answer({"bye": True})
            break
        else:
            answer({"error": f"unknown command {cmd!r}"})
    sock.close(0)
    ctx.term()


if __name__ == "__main__":
    main()
