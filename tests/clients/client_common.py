"""What the one-shot official-client scripts share (`anthropic_messages.py`, `openai_responses.py`):
their command line and the loop that runs every (model, buffered/streamed, index) once and prints
one JSON line per request."""

import argparse
import json


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
