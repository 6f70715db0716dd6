#!/usr/bin/env python3
"""The Responses API with the official `openai` Python client; one JSON line per request.

    python tests/clients/openai_responses.py --base-url http://127.0.0.1:8080/v1 \
        --model tiny-agg --n 2 --max-output-tokens 8 --timeout 10

Every model is asked `--n` times buffered (`responses.create`) and `--n` times streamed
(`responses.create(stream=True)`). The client never retries. Each output line:

    {"model", "stream", "index", "ok",
     ok:     "text", "status", "output_tokens", "id", "response_model";
             streams also "events" (event types in order)
     not ok: "status_code", "error", "message"}
"""

import argparse
import json
import sys

import openai


def run_one(client, args, model, stream, index):
    out = {"model": model, "stream": stream, "index": index}
    kwargs = dict(
        model=model,
        instructions="You are terse.",
        input=f"{args.prompt} (request {index})",
        max_output_tokens=args.max_output_tokens,
    )
    try:
        if stream:
            events = []
            final = None
            for ev in client.responses.create(stream=True, **kwargs):
                events.append(ev.type)
                if ev.type in ("response.completed", "response.incomplete"):
                    final = ev.response
            out["events"] = events
            resp = final
        else:
            resp = client.responses.create(**kwargs)
        if resp is None:
            out.update(ok=False, status_code=None, error="NoFinalResponse", message="")
            return out
        out.update(
            ok=True,
            text=resp.output_text,
            status=resp.status,
            output_tokens=resp.usage.output_tokens if resp.usage else None,
            id=resp.id,
            response_model=resp.model,
        )
    except openai.APIStatusError as e:
        out.update(ok=False, status_code=e.status_code, error=type(e).__name__, message=str(e))
    except Exception as e:
        out.update(ok=False, status_code=None, error=type(e).__name__, message=str(e))
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--base-url", required=True)
    p.add_argument("--model", action="append", required=True)
    p.add_argument("--n", type=int, default=1)
    p.add_argument("--max-output-tokens", type=int, default=8)
    p.add_argument("--timeout", type=float, default=10.0)
    p.add_argument("--prompt", default="Say hello")
    args = p.parse_args()
    client = openai.OpenAI(
        base_url=args.base_url, api_key="unused", max_retries=0, timeout=args.timeout
    )
    for model in args.model:
        for stream in (False, True):
            for i in range(args.n):
                print(json.dumps(run_one(client, args, model, stream, i)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
