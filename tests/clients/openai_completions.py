#!/usr/bin/env python3
"""Completions with the official `openai` Python client; one JSON line per request.

    python tests/clients/openai_completions.py --base-url http://127.0.0.1:8080/v1 \
        --model tiny-agg --prompt '"Say hello"' --prompt '[1, 2, 3]' --max-tokens 4 \
        --header x-backend:

Every (model, prompt) pair is sent buffered (`completions.create`) and then streamed
(`stream=True`, `stream_options: {include_usage: true}`); `--stream buffered|streamed` sends one
of the two only. `--prompt` is JSON: a string, an array
of strings, of token ids or of token-id arrays (a batch). The client never retries. Each line:

    {"model", "prompt_index", "stream", "ok",
     "headers": {x-backend / x-continuum-* response headers},
     ok:     "texts" (per choice index), "finish_reasons" (per choice index), "usage" | null, "id";
             streams also "chunks" and "usage_chunks"
     not ok: "status" (HTTP status or null), "error" (exception class), "body"}

The exit status is 0 whenever every request was attempted (failures are data).
"""

import argparse
import json
import sys

import openai
from client_common import disclosed



def collect(choices, texts, finish):
    for c in choices:
        texts[c.index] = texts.get(c.index, "") + (c.text or "")
        if c.finish_reason:
            finish[c.index] = c.finish_reason


def run_one(client, args, model, prompt_index, prompt, stream):
    out = {"model": model, "prompt_index": prompt_index, "stream": stream}
    kwargs = dict(model=model, prompt=prompt, max_tokens=args.max_tokens)
    texts, finish = {}, {}
    try:
        if stream:
            with client.completions.with_streaming_response.create(
                stream=True, stream_options={"include_usage": True}, **kwargs
            ) as resp:
                out["headers"] = disclosed(resp.headers)
                usage, chunk_id, chunks, usage_chunks = None, None, 0, 0
                for chunk in resp.parse():
                    chunks += 1
                    chunk_id = chunk.id
                    if chunk.usage is not None:
                        usage_chunks += 1
                        usage = chunk.usage.model_dump()
                    collect(chunk.choices, texts, finish)
            out.update(id=chunk_id, usage=usage, chunks=chunks, usage_chunks=usage_chunks)
        else:
            raw = client.completions.with_raw_response.create(**kwargs)
            out["headers"] = disclosed(raw.headers)
            resp = raw.parse()
            collect(resp.choices, texts, finish)
            out.update(id=resp.id, usage=resp.usage.model_dump() if resp.usage else None)
        out.update(
            ok=True,
            texts=[texts[i] for i in sorted(texts)],
            finish_reasons=[finish.get(i) for i in sorted(texts)],
        )
    except openai.APIStatusError as e:
        out.update(
            ok=False,
            status=e.status_code,
            error=type(e).__name__,
            body=e.response.text,
            headers=disclosed(e.response.headers),
        )
    except Exception as e:  # a transport failure is data too
        out.update(ok=False, status=None, error=type(e).__name__, body=str(e))
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base-url", required=True)
    p.add_argument("--model", action="append", required=True)
    p.add_argument("--prompt", action="append", required=True, help="a JSON prompt")
    p.add_argument("--max-tokens", type=int, default=4)
    p.add_argument("--timeout", type=float, default=10.0)
    p.add_argument("--api-key", default="unused")
    p.add_argument("--header", action="append", default=[], help="NAME:VALUE on every request")
    p.add_argument("--stream", choices=["both", "buffered", "streamed"], default="both")
    args = p.parse_args()
    headers = dict(h.split(":", 1) for h in args.header)
    client = openai.OpenAI(
        base_url=args.base_url,
        api_key=args.api_key,
        max_retries=0,
        timeout=args.timeout,
        default_headers=headers,
    )
    prompts = [json.loads(x) for x in args.prompt]
    modes = {"both": (False, True), "buffered": (False,), "streamed": (True,)}[args.stream]
    for model in args.model:
        for i, prompt in enumerate(prompts):
            for stream in modes:
                print(json.dumps(run_one(client, args, model, i, prompt, stream)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
