"""A minimal OpenAI-compatible backend in its own process, for tests that stop it (SIGSTOP).

Binds 127.0.0.1 on an ephemeral port and prints one JSON line `{"port": N}` once it listens.
Serves HTTP/1.1 keep-alive:
- `GET /health`: 200 `{"status":"healthy"}`;
- `POST /v1/chat/completions`: a chat completion whose content is the backend's name, or, with
  `"stream": true`, an SSE stream of three chunks and `[DONE]` (chunked framing).
Everything else is 404. Threads are daemons; the process ends when its stdin closes (the test
dropped it) or it is killed.
"""

import http.server
import json
import sys
import threading


NAME = sys.argv[1] if len(sys.argv) > 1 else "stub"


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def send_json(self, status, obj):
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/health":
            self.send_json(200, {"status": "healthy", "backend": NAME})
        else:
            self.send_json(404, {"error": "not found"})

    def do_POST(self):
        length = int(self.headers.get("content-length", "0"))
        raw = self.rfile.read(length)
        if self.path != "/v1/chat/completions":
            self.send_json(404, {"error": "not found"})
            return
        try:
            req = json.loads(raw)
        except ValueError:
            self.send_json(400, {"error": {"message": "bad json"}})
            return
        model = req.get("model", "")
        if not req.get("stream"):
            self.send_json(200, {
                "id": f"chatcmpl-{NAME}",
                "object": "chat.completion",
                "created": 0,
                "model": model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": NAME},
                             "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            })
            return
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        for i, piece in enumerate([NAME, " says", " hi"]):
            chunk = {
                "id": f"chatcmpl-{NAME}", "object": "chat.completion.chunk", "created": 0,
                "model": model,
                "choices": [{"index": 0, "delta": {"content": piece},
                             "finish_reason": "stop" if i == 2 else None}],
            }
            self.write_chunk(f"data: {json.dumps(chunk)}\n\n".encode())
        self.write_chunk(b"data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")

    def write_chunk(self, data):
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()


def main():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(json.dumps({"port": server.server_address[1]}), flush=True)
    sys.stdin.read()  # until the test closes our stdin
    server.shutdown()


if __name__ == "__main__":
    main()
