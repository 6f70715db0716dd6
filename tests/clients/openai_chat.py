#!/usr/bin/env python3
"""Chat completions with the official `openai` Python client; one JSON line per request.

Run with the fleet venv's python (tests/fleet/install.sh installs `openai` there):

    python tests/clients/openai_chat.py --base-url http://127.0.0.1:8080/v1 \
        --model tiny-agg --model tiny-disagg --stream both --n 2 --max-tokens 8 \
        --header x-backend: --concurrency 4 --timeout 10

Every (model, stream) combination is sent `--n` times; `--concurrency` requests run at once
(threads sharing one client). The client never retries (`max_retries=0`), so a failure is
reported as it happened. Each output line:

    {"model", "stream", "index", "ok", "elapsed_s",
     "headers": {x-backend / x-continuum-* response headers},
     ok:     "text", "finish_reason", "usage": {prompt_tokens, completion_tokens, total_tokens} | null,
             "id", "response_model";
             streams also "chunks" (parsed chunks), "content_chunks", "usage_chunks",
             "raw_done" (the wire carried `data: [DONE]`)
     not ok: "status" (HTTP status or null), "error" (exception class), "message", "body"}

Streams ask for `stream_options: {include_usage: true}`. The exit status is 0 whenever every
request was attempted (failures are data, not crashes).
"""

import argparse
import json
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import openai
from client_common import disclosed

try:  # openai 3.x ships its HTTP stack as `httpx2`; older releases use `httpx`
    import httpx2 as httpx
except ImportError:  # pragma: no cover
    import httpx



class TeeStream(httpx.SyncByteStream):
    """Wraps a response body stream and keeps a copy of what the client read."""

    def __init__(self, inner, sink):
        self._inner = inner
        self._sink = sink

    def __iter__(self):
        for chunk in self._inner:
            self._sink.extend(chunk)
            yield chunk

    def close(self):
        self._inner.close()


class RecordingTransport(httpx.HTTPTransport):
    """An httpx transport that records each response's raw body per thread (for `[DONE]`)."""

    local = threading.local()

    def handle_request(self, request):
        response = super().handle_request(request)
        sink = bytearray()
        RecordingTransport.local.sink = sink
        response.stream = TeeStream(response.stream, sink)
        return response


def run_one(client, args, model, stream, index):
    messages = [{"role": "user", "content": f"{args.prompt} (request {index})"}]
    started = time.monotonic()
    out = {"model": model, "stream": stream, "index": index}
    try:
        if stream:
            with client.chat.completions.with_streaming_response.create(
                model=model,
                messages=messages,
                max_tokens=args.max_tokens,
                stream=True,
                stream_options={"include_usage": True},
            ) as resp:
                out["headers"] = disclosed(resp.headers)
                text, finish, usage, chunk_id, resp_model = [], None, None, None, None
                chunks = content_chunks = usage_chunks = 0
                for chunk in resp.parse():
                    chunks += 1
                    chunk_id = chunk.id
                    resp_model = chunk.model
                    if chunk.usage is not None:
                        usage_chunks += 1
                        usage = chunk.usage.model_dump()
                    for choice in chunk.choices:
                        if choice.delta and choice.delta.content:
                            content_chunks += 1
                            text.append(choice.delta.content)
                        if choice.finish_reason:
                            finish = choice.finish_reason
            raw = bytes(getattr(RecordingTransport.local, "sink", b""))
            out.update(
                ok=True,
                text="".join(text),
                finish_reason=finish,
                usage=usage,
                id=chunk_id,
                response_model=resp_model,
                chunks=chunks,
                content_chunks=content_chunks,
                usage_chunks=usage_chunks,
                raw_done=b"data: [DONE]" in raw,
            )
        else:
            raw = client.chat.completions.with_raw_response.create(
                model=model, messages=messages, max_tokens=args.max_tokens
            )
            out["headers"] = disclosed(raw.headers)
            completion = raw.parse()
            choice = completion.choices[0]
            out.update(
                ok=True,
                text=choice.message.content or "",
                finish_reason=choice.finish_reason,
                usage=completion.usage.model_dump() if completion.usage else None,
                id=completion.id,
                response_model=completion.model,
            )
    except openai.APIStatusError as e:
        out.update(
            ok=False,
            status=e.status_code,
            error=type(e).__name__,
            message=str(e),
            body=e.response.text if e.response is not None else None,
            headers=disclosed(e.response.headers) if e.response is not None else {},
        )
    except Exception as e:  # timeouts, connection errors, malformed streams
        out.update(ok=False, status=None, error=type(e).__name__, message=str(e))
    out["elapsed_s"] = round(time.monotonic() - started, 3)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:8080/v1")
    ap.add_argument("--model", action="append", required=True, help="repeatable")
    ap.add_argument("--stream", choices=["false", "true", "both"], default="false")
    ap.add_argument("--n", type=int, default=1, help="requests per (model, stream)")
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--prompt", default="Say something about routers.")
    ap.add_argument("--timeout", type=float, default=10.0, help="per request, seconds")
    ap.add_argument("--api-key", default="unused", help="sent as Authorization: Bearer")
    ap.add_argument(
        "--header", action="append", default=[], help="NAME:VALUE sent on every request"
    )
    args = ap.parse_args()

    headers = {}
    for h in args.header:
        name, _, value = h.partition(":")
        headers[name.strip()] = value.strip()
    client = openai.OpenAI(
        base_url=args.base_url,
        api_key=args.api_key,
        timeout=args.timeout,
        max_retries=0,
        default_headers=headers,
        http_client=httpx.Client(
            transport=RecordingTransport(),
            timeout=args.timeout,
            limits=httpx.Limits(max_connections=max(args.concurrency, 1)),
        ),
    )
    streams = {"false": [False], "true": [True], "both": [False, True]}[args.stream]
    jobs = [(m, s, i) for m in args.model for s in streams for i in range(args.n)]
    lock = threading.Lock()

    def job(spec):
        result = run_one(client, args, *spec)
        with lock:
            sys.stdout.write(json.dumps(result) + "\n")
            sys.stdout.flush()

    with ThreadPoolExecutor(max_workers=max(args.concurrency, 1)) as pool:
        list(pool.map(job, jobs))


if __name__ == "__main__":
    main()
