"""What the official-client scripts share: the command line and the loop of the one-shot scripts
(`anthropic_messages.py`, `openai_responses.py`) that run every (model, buffered/streamed, index)
once and print one JSON line per request, and the disclosed-header filter (`openai_chat.py`,
`openai_completions.py`)."""

import argparse
import json

# Response headers the router discloses (with `x-backend` on the request).
DISCLOSED = ("x-backend", "x-continuum-")


def disclosed(headers):
    """The disclosed response headers, names lower-cased."""
    return {k.lower(): v for k, v in headers.items() if k.lower().startswith(DISCLOSED)}


def arguments(description, tokens_flag):
    """Parse `--base-url`, `--model` (repeatable), `--n`, `tokens_flag` (the protocol's output
    token limit), `--timeout`, `--prompt` and `--api-key` (the client's own credential header)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--base-url", required=True)
    p.add_argument("--model", action="append", required=True)
    p.add_argument("--n", type=int, default=1)
    p.add_argument(tokens_flag, type=int, default=8)
    p.add_argument("--timeout", type=float, default=10.0)
    p.add_argument("--prompt", default="Say hello")
    p.add_argument("--api-key", default="unused")
    return p.parse_args()


def run_each(client, args, run_one):
    """`run_one(client, args, model, stream, index)` for every model, buffered then streamed,
    `--n` times each; one JSON line per request. Returns the exit status (always 0: failures are
    data)."""
    for model in args.model:
        for stream in (False, True):
            for i in range(args.n):
                print(json.dumps(run_one(client, args, model, stream, i)), flush=True)
    return 0
