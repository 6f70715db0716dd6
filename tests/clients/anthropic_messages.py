#!/usr/bin/env python3
"""Anthropic Messages with the official `anthropic` Python client; one JSON line per request.

Run with the fleet venv's python (tests/fleet/install.sh installs `anthropic` there):

    python tests/clients/anthropic_messages.py --base-url http://127.0.0.1:8080 \
        --model tiny-agg --model tiny-disagg --n 2 --max-tokens 8 --timeout 10

Every model is asked `--n` times buffered (`messages.create`) and `--n` times streamed
(`messages.stream`, whose accumulator rebuilds the final message from the events). The client
never retries (`max_retries=0`). Each output line:

    {"model", "stream", "index", "ok",
     ok:     "text", "stop_reason", "usage": {input_tokens, output_tokens}, "id",
             "response_model", "role", "type";
             streams also "events" (event type names in order), "text_deltas"
     not ok: "status", "error" (exception class), "message", "error_type" (Anthropic error.type)}
"""

import sys

import client_common

import anthropic


def run_one(client, args, model, stream, index):
    messages = [{"role": "user", "content": f"{args.prompt} (request {index})"}]
    out = {"model": model, "stream": stream, "index": index}
    try:
        if stream:
            events = []
            deltas = 0
            with client.messages.stream(
                model=model, max_tokens=args.max_tokens, system="You are terse.", messages=messages
            ) as s:
                for ev in s:
                    events.append(ev.type)
                    if ev.type == "content_block_delta":
                        deltas += 1
                msg = s.get_final_message()
            out["events"] = events
            out["text_deltas"] = deltas
        else:
            msg = client.messages.create(
                model=model, max_tokens=args.max_tokens, system="You are terse.", messages=messages
            )
        out.update(
            ok=True,
            text="".join(b.text for b in msg.content if b.type == "text"),
            stop_reason=msg.stop_reason,
            usage={"input_tokens": msg.usage.input_tokens, "output_tokens": msg.usage.output_tokens},
            id=msg.id,
            response_model=msg.model,
            role=msg.role,
            type=msg.type,
        )
    except anthropic.APIStatusError as e:
        body = e.body if isinstance(e.body, dict) else {}
        out.update(
            ok=False,
            status=e.status_code,
            error=type(e).__name__,
            message=str(e),
            error_type=(body.get("error") or {}).get("type"),
        )
    except Exception as e:  # transport failures, timeouts, protocol errors
        out.update(ok=False, status=None, error=type(e).__name__, message=str(e), error_type=None)
    return out


def main():
    args = client_common.arguments(__doc__.splitlines()[0], "--max-tokens")
    client = anthropic.Anthropic(
        base_url=args.base_url, api_key=args.api_key, max_retries=0, timeout=args.timeout
    )
    return client_common.run_each(client, args, run_one)


if __name__ == "__main__":
    sys.exit(main())
