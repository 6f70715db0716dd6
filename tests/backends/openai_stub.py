"""A minimal OpenAI-compatible backend in its own process, for tests that stop it (SIGSTOP).

Usage: openai_stub.py NAME [--tls CERT_PEM KEY_PEM]

Binds 127.0.0.1 on an ephemeral port and prints one JSON line `{"port": N}` once it listens.
With `--tls` it serves HTTPS (Python's ssl, i.e. OpenSSL: a TLS stack not written here), ALPN
`http/1.1`, the handshake done in each connection's thread.
Serves HTTP/1.1 keep-alive:
- `GET /health`: 200 `{"status":"healthy"}`;
- `GET /connections`: 200 `{"connections": N}`, the connections accepted so far;
- `POST /v1/chat/completions`: a chat completion whose content is the backend's name, or, with
  `"stream": true`, an SSE stream of three chunks and `[DONE]` (chunked framing). A last user
  message `repeat:N` repeats the name N times in each content (bodies over many TLS records).
Everything else is 404. Threads are daemons; the process ends when its stdin closes (the test
dropped it) or it is killed.
"""

import http.server
import json
import ssl
import sys
import threading


NAME = sys.argv[1] if len(sys.argv) > 1 else "stub"
TLS = sys.argv[3:5] if len(sys.argv) > 4 and sys.argv[2] == "--tls" else None
CONNECTIONS = 0
LOCK = threading.Lock()


def content_of(req):
    """The backend's name, repeated as the last message's `repeat:N` asks."""
    messages = req.get("messages") or [{}]
    last = messages[-1].get("content", "")
    if isinstance(last, str) and last.startswith("repeat:"):
        return NAME * int(last[len("repeat:"):])
    return NAME


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def setup(self):
        global CONNECTIONS
        with LOCK:
            CONNECTIONS += 1
        if TLS:
            self.request.do_handshake()
        super().setup()

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
        elif self.path == "/connections":
            with LOCK:
                n = CONNECTIONS
            self.send_json(200, {"connections": n})
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
        content = content_of(req)
        if not req.get("stream"):
            self.send_json(200, {
                "id": f"chatcmpl-{NAME}",
                "object": "chat.completion",
                "created": 0,
                "model": model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                             "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            })
            return
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        for i, piece in enumerate([content, " says", " hi"]):
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


class Server(http.server.ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        pass  # a client that rejected our certificate, or left: nothing to report


def main():
    server = Server(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    if TLS:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(TLS[0], TLS[1])
        ctx.set_alpn_protocols(["http/1.1"])
        # The handshake runs in the connection's thread, on its first read, so a client that
        # rejects the certificate never stalls the accept loop.
        server.socket = ctx.wrap_socket(server.socket, server_side=True,
                                        do_handshake_on_connect=False)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(json.dumps({"port": server.server_address[1]}), flush=True)
    sys.stdin.read()  # until the test closes our stdin
    server.shutdown()


if __name__ == "__main__":
    main()
