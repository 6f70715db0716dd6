"""The official `openai` client's model calls against a router: `models.list()`, then
`models.retrieve(id)` for every `--retrieve` id. Prints one JSON line: the listed ids in order and,
per retrieved id, the model the SDK parsed or the status and body of its error. Failures of calls
are data; only a crash exits non-zero."""

import argparse
import json

import openai


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--base-url", required=True)
    p.add_argument("--retrieve", action="append", default=[])
    p.add_argument("--api-key", default="unused")
    p.add_argument("--timeout", type=float, default=10.0)
    args = p.parse_args()
    client = openai.OpenAI(base_url=args.base_url, api_key=args.api_key, timeout=args.timeout,
                           max_retries=0)
    listed = [m.id for m in client.models.list()]
    retrieved = {}
    for model_id in args.retrieve:
        try:
            m = client.models.retrieve(model_id)
            retrieved[model_id] = {"ok": True, "id": m.id, "object": m.object}
        except openai.APIStatusError as e:
            retrieved[model_id] = {"ok": False, "status": e.status_code, "body": e.response.text}
    print(json.dumps({"listed": listed, "retrieved": retrieved}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
