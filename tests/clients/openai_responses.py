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

import sys

import client_common

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
    args = client_common.arguments(__doc__.splitlines()[0], "--max-output-tokens")
    client = openai.OpenAI(
        base_url=args.base_url, api_key=args.api_key, max_retries=0, timeout=args.timeout
    )
    return client_common.run_each(client, args, run_one)


if __name__ == "__main__":
    sys.exit(main())
